// How deep a JSON text nests, measured before it is parsed (common/json_depth.cpp). Pure.
//
// nlohmann's parser is iterative, but a value nested thousands deep costs a stack frame per level
// when it is destroyed or walked: text from a peer, a job's converter or a stack reader is
// measured first and refused past a bound. The one depth check: use it rather than another.
#pragma once

#include <cstddef>
#include <string_view>

namespace ddp {

// Whether `text` nests '[' and '{' at most `limit` deep, brackets inside strings (escapes
// included) not counted. A closer with nothing open is ignored (the parse refuses it anyway), so
// it cannot buy an opener more depth. Stops at the first opener past the limit.
bool json_depth_within(std::string_view text, std::size_t limit);

}  // namespace ddp
