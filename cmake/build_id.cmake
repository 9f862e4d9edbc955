# cmake -P script, run at every build (the dpt_build_id target, CMakeLists.txt): writes OUT, a header that defines
# DPT_VERSION (VERSION) and DPT_BUILD_ID (`git describe --always --dirty` of SOURCE_DIR, "unknown" without git or
# outside a git checkout), rewriting it only when it changed, so that only the files that include it recompile, and
# only after a new commit or a change to the tree. dptrain --version, dprun --version and the ranks' same-binary
# check (trainer/config_check.cpp) print it; taken when cmake configured the build, it went stale after a pull.
set(id unknown)
if(GIT_EXECUTABLE)
  execute_process(COMMAND "${GIT_EXECUTABLE}" describe --always --dirty WORKING_DIRECTORY "${SOURCE_DIR}"
                  OUTPUT_VARIABLE described OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
  if(rc EQUAL 0 AND NOT described STREQUAL "")
    set(id "${described}")
  endif()
endif()
string(CONCAT text "// Written by cmake/build_id.cmake at build time: do not edit.\n"
                   "#define DPT_VERSION \"${VERSION}\"\n#define DPT_BUILD_ID \"${id}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
