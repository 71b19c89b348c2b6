// A libtorch C++ DDP worker (CPU, gloo through c10d), started by ddpctl like any rank.
//
// It reads the environment contract, joins the job's store as a client (ddpctl serves it:
// TORCHELASTIC_USE_AGENT_STORE=True, so no rank binds MASTER_PORT), builds a gloo process
// group, trains a small regression model on synthetic data sharded by rank, all-reduces the
// gradients by hand (what DDP's reducer does, without buckets) and prints the loss. At the end
// every rank prints a checksum of its parameters: equal checksums mean the ranks agree.
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>

namespace {

std::string env(const char* name, const char* fallback = nullptr) {
  if (const char* v = std::getenv(name)) return v;
  if (fallback) return fallback;
  throw std::runtime_error(std::string(name) + " is not set: start this program with ddpctl launch (or torchrun)");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int rank = std::stoi(env("RANK"));
    const int world = std::stoi(env("WORLD_SIZE"));
    const int epochs = argc > 1 ? std::stoi(argv[1]) : 20;
    const std::string attempt = env("TORCHELASTIC_RESTART_COUNT", "0");

    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(std::stoi(env("MASTER_PORT")));
    so.isServer = false;  // the launcher hosts the store
    so.numWorkers = world;
    so.waitWorkers = false;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(env("MASTER_ADDR"), so);
    auto store = c10::make_intrusive<c10d::PrefixStore>("/ddp_cpp/attempt_" + attempt, tcp);

    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(env("GLOO_SOCKET_IFNAME", "lo")));
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);

    // The same data and initial weights everywhere; each rank trains on its own shard.
    torch::manual_seed(1234);
    auto x = torch::randn({1024, 8});
    auto true_w = torch::randn({8, 1});
    auto y = torch::matmul(x, true_w) + 0.01 * torch::randn({1024, 1});
    auto shard_x = x.slice(0, rank, x.size(0), world);
    auto shard_y = y.slice(0, rank, y.size(0), world);

    torch::manual_seed(0);
    torch::nn::Linear model(8, 1);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));

    for (int epoch = 0; epoch < epochs; ++epoch) {
      sgd.zero_grad();
      auto loss = torch::mse_loss(model->forward(shard_x), shard_y);
      loss.backward();
      for (auto& p : model->parameters()) {
        std::vector<at::Tensor> grads{p.grad()};
        pg->allreduce(grads)->wait();
        p.grad().div_(world);
      }
      sgd.step();
      std::vector<at::Tensor> l{loss.detach().clone()};
      pg->allreduce(l)->wait();
      if (rank == 0 && (epoch % 5 == 0 || epoch == epochs - 1)) {
        std::printf("epoch %d loss %.6f\n", epoch, l[0].item<float>() / world);
        std::fflush(stdout);
      }
    }
    double checksum = 0;
    for (auto& p : model->parameters()) checksum += p.abs().sum().item<double>();
    std::printf("rank %d parameter checksum %.9f\n", rank, checksum);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_cpp_example: %s\n", e.what());
    return 1;
  }
}
