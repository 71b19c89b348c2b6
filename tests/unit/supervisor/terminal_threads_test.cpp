// The terminal writer's thread for real, for ThreadSanitizer (label tsan; scripts/test runs it in
// build-tsan): several threads write lines to both streams and flush at once while the writer
// thread writes them out. stdout and stderr are pipes here, drained by reader threads; every line
// arrives once, each thread's lines in its order.
#include "supervisor/output.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <map>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

using namespace ddp::supervisor;

namespace {

// fd (1 or 2) replaced by a pipe's write end for the object's life; what was written is read
// by a thread and handed back by take().
class Captured {
 public:
  explicit Captured(int fd) : fd_(fd) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    saved_ = ::dup(fd_);
    ::dup2(p[1], fd_);
    ::close(p[1]);
    read_end_ = p[0];
    reader_ = std::thread([this] {
      char buf[65536];
      for (;;) {
        const auto n = ::read(read_end_, buf, sizeof buf);
        if (n > 0) {
          text_.append(buf, static_cast<std::size_t>(n));
        } else if (n == 0 || errno != EINTR) {
          return;
        }
      }
    });
  }
  // The fd back as it was (the pipe's last write end closed), the reader joined.
  std::string take() {
    if (saved_ >= 0) {
      ::dup2(saved_, fd_);
      ::close(saved_);
      saved_ = -1;
      reader_.join();
      ::close(read_end_);
    }
    return text_;
  }
  ~Captured() { take(); }

 private:
  int fd_;
  int saved_ = -1;
  int read_end_ = -1;
  std::thread reader_;
  std::string text_;
};

// "w<thread> <n>" lines of `text`, by thread, in the order they came.
std::map<int, std::vector<int>> lines_by_writer(const std::string& text) {
  std::map<int, std::vector<int>> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    int w = -1, n = -1;
    if (std::sscanf(l.c_str(), "w%d %d", &w, &n) == 2) out[w].push_back(n);
  }
  return out;
}

}  // namespace

TEST(TerminalThreads, LinesFromManyThreadsArriveOnceAndInEachThreadsOrder) {
  constexpr int kWriters = 8, kLines = 400;
  std::string out, err;
  {
    Captured cap_out(1), cap_err(2);
    {
      TerminalSink sink(64u << 20);  // room for every line: none dropped
      std::vector<std::thread> writers;
      for (int w = 0; w < kWriters; ++w) {
        writers.emplace_back([&sink, w] {
          for (int i = 0; i < kLines; ++i) {
            std::string line = "w";  // appended, not `"w" + ...`: GCC 12 warns (-Wrestrict) about that
            line += std::to_string(w);
            line += ' ';
            line += std::to_string(i);
            sink.write(i % 2 ? Stream::err : Stream::out, std::move(line));
            if (i % 50 == 0) sink.flush(std::chrono::milliseconds(2000));
          }
        });
      }
      for (auto& t : writers) t.join();
      EXPECT_TRUE(sink.flush(std::chrono::milliseconds(10000)));
    }  // the sink drains and joins its thread
    out = cap_out.take();
    err = cap_err.take();
  }
  const auto outs = lines_by_writer(out), errs = lines_by_writer(err);
  ASSERT_EQ(outs.size(), std::size_t{kWriters}) << out.substr(0, 2000);
  ASSERT_EQ(errs.size(), std::size_t{kWriters}) << err.substr(0, 2000);
  for (int w = 0; w < kWriters; ++w) {
    std::vector<int> want_out, want_err;
    for (int i = 0; i < kLines; ++i) (i % 2 ? want_err : want_out).push_back(i);
    EXPECT_EQ(outs.at(w), want_out) << "writer " << w << " on stdout";
    EXPECT_EQ(errs.at(w), want_err) << "writer " << w << " on stderr";
  }
}

// A sink that cannot make its thread (the user's process limit used up by the job's own threads,
// say) writes its lines where they come instead of failing the caller: a job is never ended for
// its output. Threads are made to fail here by a default stack larger than any address space
// (1 EiB: refused whatever the host's overcommit policy).
TEST(TerminalThreads, ASinkWithoutAThreadWritesItsLinesItself) {
  std::string out, err;
  {
    Captured cap_out(1), cap_err(2);  // their reader threads first, with the usual stacks
    pthread_attr_t saved, huge;
    ASSERT_EQ(pthread_getattr_default_np(&saved), 0);
    ASSERT_EQ(pthread_attr_init(&huge), 0);
    ASSERT_EQ(pthread_attr_setstacksize(&huge, std::size_t{1} << 60), 0);
    ASSERT_EQ(pthread_setattr_default_np(&huge), 0);
    bool thread_failed = false;
    try {
      std::thread([] {}).join();
    } catch (const std::system_error&) {
      thread_failed = true;
    }
    {
      TerminalSink sink;
      if (thread_failed) {
        EXPECT_NO_THROW(sink.write(Stream::out, "first"));
        EXPECT_NO_THROW(sink.write(Stream::err, "second"));
        EXPECT_NO_THROW(sink.write(Stream::out, "third"));
        EXPECT_TRUE(sink.flush(std::chrono::milliseconds(1000)));
      }
    }
    ASSERT_EQ(pthread_setattr_default_np(&saved), 0);
    pthread_attr_destroy(&huge);
    pthread_attr_destroy(&saved);
    ASSERT_TRUE(thread_failed) << "a thread with a 1 EiB stack was made: this test proves nothing here";
    out = cap_out.take();
    err = cap_err.take();
  }
  EXPECT_EQ(out, "first\nthird\n");
  EXPECT_EQ(err, "second\n");
}
