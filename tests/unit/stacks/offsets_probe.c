/* Prints the CPython layout lib/stacks/cpython.cpp's table needs, as offsetof()/sizeof() over
 * the internal headers of an installed CPython (Debian: python3.11-dev; a source build's
 * Include/). Build: cc -I/usr/include/python3.11 offsets_probe.c. The unit test stacks_test
 * compares its output with the table; for a new version, its output is the new table row. */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>

#include "internal/pycore_frame.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_runtime.h"

#define P(name, expr) printf("%s %zu\n", name, (size_t)(expr))
int main(void) {
  printf("version %d.%d\n", PY_MAJOR_VERSION, PY_MINOR_VERSION);
  P("runtime_interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
  P("interp_next", offsetof(PyInterpreterState, next));
  P("interp_threads_head", offsetof(PyInterpreterState, threads.head));
  P("tstate_next", offsetof(PyThreadState, next));
  P("tstate_thread_id", offsetof(PyThreadState, thread_id));
  P("tstate_native_thread_id", offsetof(PyThreadState, native_thread_id));
  P("tstate_cframe", offsetof(PyThreadState, cframe));
  P("cframe_current_frame", offsetof(_PyCFrame, current_frame));
  P("frame_code", offsetof(_PyInterpreterFrame, f_code));
  P("frame_previous", offsetof(_PyInterpreterFrame, previous));
  P("frame_prev_instr", offsetof(_PyInterpreterFrame, prev_instr));
  P("frame_owner", offsetof(_PyInterpreterFrame, owner));
  P("owner_generator", FRAME_OWNED_BY_GENERATOR);
  P("code_filename", offsetof(PyCodeObject, co_filename));
  P("code_name", offsetof(PyCodeObject, co_name));
  P("code_qualname", offsetof(PyCodeObject, co_qualname));
  P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
  P("code_linetable", offsetof(PyCodeObject, co_linetable));
  P("code_firsttraceable", offsetof(PyCodeObject, _co_firsttraceable));
  P("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
  P("bytes_size", offsetof(PyBytesObject, ob_base.ob_size));
  P("bytes_sval", offsetof(PyBytesObject, ob_sval));
  P("unicode_length", offsetof(PyASCIIObject, length));
  P("unicode_state", offsetof(PyASCIIObject, state));
  P("unicode_ascii_size", sizeof(PyASCIIObject));
  P("unicode_compact_size", sizeof(PyCompactUnicodeObject));
  return 0;
}
