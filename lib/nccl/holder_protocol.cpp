// Parser of the id holder's stdout line (protocol in holder_protocol.hpp).
#include "nccl/holder_protocol.hpp"

#include <string>

namespace ddp::nccl::holder {

Parsed<UniqueId> parse_line(std::string_view line) {
  if (line.ends_with('\n')) line.remove_suffix(1);
  if (line.ends_with('\r')) line.remove_suffix(1);
  if (line.starts_with(kErrorPrefix)) {
    line.remove_prefix(kErrorPrefix.size());
    return Parsed<UniqueId>::fail(std::string(line.empty() ? "unspecified error" : line));
  }
  auto id = unique_id_from_hex(line);
  if (!id) return Parsed<UniqueId>::fail(std::string(kBinaryName) + " printed a malformed line: " + id.error);
  return id;
}

}  // namespace ddp::nccl::holder
