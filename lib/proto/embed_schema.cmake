# Turns proto/messages.json into a C++ header holding its bytes, so the library validates
# against exactly the schema in the tree (no run-time file lookup, no drift).
# Usage: cmake -DIN=messages.json -DOUT=schema_data.hpp -P embed_schema.cmake
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}.tmp" "// Generated from proto/messages.json by lib/proto/embed_schema.cmake; do not edit.\n#pragma once\n\nnamespace ddp::proto::generated {\n\ninline constexpr unsigned char kSchemaJson[] = {\n${bytes}};\n\n}  // namespace ddp::proto::generated\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
