# Turns a helper script into a C++ header holding its text, so the binary runs exactly the script
# in the tree (with `python -c`), with nothing to install or find at run time.
# Usage: cmake -DIN=script.py -DOUT=script.hpp -DNAME=kScript -P embed_script.cmake
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}.tmp" "// Generated from ${IN} by lib/hang/embed_script.cmake; do not edit.\n#pragma once\n\nnamespace ddp::hang::generated {\n\ninline constexpr unsigned char ${NAME}[] = {\n${bytes}0};\n\n}  // namespace ddp::hang::generated\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
