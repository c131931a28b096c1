# The torch the extension is built against, asked of the Python that builds
# it: its folder, its version, and its CUDA version (empty for a CPU build).
# Asked at the top level because whether ringx builds its CUDA side follows
# from it (cmake/cuda.cmake), before any target exists.
find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
# Autoload off: the query must not depend on a ringx already installed there.
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env TORCH_DEVICE_BACKEND_AUTOLOAD=0 "${Python_EXECUTABLE}" -c
    "import torch, os; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE TORCH_QUERY COMMAND_ERROR_IS_FATAL ANY)
string(REPLACE "\n" ";" TORCH_QUERY "${TORCH_QUERY}")
list(GET TORCH_QUERY 0 TORCH_DIR)
list(GET TORCH_QUERY 1 RINGX_TORCH_VERSION)
list(GET TORCH_QUERY 2 RINGX_TORCH_CUDA)
if(RINGX_TORCH_CUDA)
  message(STATUS "ringx: building against torch ${RINGX_TORCH_VERSION} (CUDA ${RINGX_TORCH_CUDA}) in ${TORCH_DIR}")
else()
  message(STATUS "ringx: building against torch ${RINGX_TORCH_VERSION} (CPU) in ${TORCH_DIR}")
endif()
