# Fails the build when the extension does not load the shared libstdc++.
#
# torch loads libstdc++.so.6 into the process. An extension carrying its own
# static copy (a compiler whose default or flags link it statically, e.g.
# -static-libstdc++) puts a second copy beside it, whose exported symbols the
# loader may bind to either copy. A build on a GPU machine whose /opt/gcc
# linked it statically crashed every rank with SIGSEGV in iostream number
# formatting during init_process_group.
#
# Run as: cmake -DLIB=<extension> -DREADELF=<readelf> -DCXX=<compiler> -P <this file>
if(NOT LIB OR NOT EXISTS "${LIB}")
  message(FATAL_ERROR "check_shared_libstdcxx: no library to check (LIB='${LIB}')")
endif()
if(NOT READELF)
  message(WARNING "ringx: no readelf found; cannot check that ${LIB} links libstdc++ shared")
  return()
endif()
execute_process(COMMAND "${READELF}" -d "${LIB}"
  OUTPUT_VARIABLE dynamic ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_shared_libstdcxx: '${READELF} -d ${LIB}' failed (${rc}): ${err}")
endif()
if(NOT dynamic MATCHES "\\(NEEDED\\)[^\n]*\\[libstdc\\+\\+\\.so\\.6\\]")
  string(REGEX MATCHALL "\\[[^]\n]+\\.so[^]\n]*\\]" needed "${dynamic}")
  string(REPLACE ";" " " needed "${needed}")
  message(FATAL_ERROR
    "ringx: ${LIB} does not load the shared libstdc++ (libstdc++.so.6 is not among its "
    "dependencies: ${needed}). The compiler ${CXX} linked the C++ library into it "
    "statically (or linked another C++ library); torch uses the shared libstdc++.so.6, "
    "and two copies in one process crash. Build without -static-libstdc++, with a "
    "compiler that links libstdc++ shared (for example CXX=/usr/bin/g++ CC=/usr/bin/gcc).")
endif()
