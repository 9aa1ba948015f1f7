# kvattn_install.cmake - install rules of kvattn (issue #21).
#
# `cmake --install build --prefix P` puts under P:
#   include/kvattn.h, kvattn_cache.h, kvattn_merge.h, kvattn_mla.h, kvattn_pool.h, kvattn_dcp.h,
#   kvattn_c8.h, kvattn_cuda.h
#   lib/libkvattn.so (+ versioned names), lib/libkvattn.a
#   lib/pkgconfig/kvattn.pc                       (pkg-config kvattn)
#   lib/cmake/kvattn/kvattnConfig*.cmake, targets (find_package(kvattn) ->
#     kvattn::kvattn shared, kvattn::kvattn_static; component "cuda" found
#     when the CUDA backend was built)
# The Python wheel build (scikit-build-core sets SKBUILD) installs only the
# shared library, into the package folder kvattn/ next to its Python files.

if(SKBUILD)
  install(TARGETS kvattn LIBRARY DESTINATION kvattn RUNTIME DESTINATION kvattn)
  return()
endif()

option(KVA_INSTALL "Generate install rules, kvattn.pc and the CMake package" ON)
if(NOT KVA_INSTALL)
  return()
endif()

include(CMakePackageConfigHelpers)

set_target_properties(kvattn PROPERTIES VERSION ${PROJECT_VERSION}
                                        SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
                                        EXPORT_NAME kvattn)
set_target_properties(kvattn_static PROPERTIES EXPORT_NAME kvattn_static)

install(TARGETS kvattn kvattn_static EXPORT kvattnTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES include/kvattn.h include/kvattn_cache.h include/kvattn_merge.h include/kvattn_mla.h
              include/kvattn_pool.h include/kvattn_dcp.h include/kvattn_c8.h include/kvattn_cuda.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(KVA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvattn)
install(EXPORT kvattnTargets NAMESPACE kvattn:: DESTINATION ${KVA_CMAKE_DIR})
configure_package_config_file(cmake/kvattnConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/kvattnConfig.cmake
                              INSTALL_DESTINATION ${KVA_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvattnConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvattnConfig.cmake
              ${PROJECT_BINARY_DIR}/kvattnConfigVersion.cmake
        DESTINATION ${KVA_CMAKE_DIR})

# pkg-config: `pkg-config --cflags --libs kvattn` links the shared library;
# `--static` adds what the static one needs. The prefix is found relative to
# the .pc file, so an installed tree can be moved.
set(KVA_PC_REQUIRES_PRIVATE "")
if(OpenMP_C_FLAGS)
  string(PREPEND KVA_PC_LIBS_PRIVATE "${OpenMP_C_FLAGS}")
endif()
string(APPEND KVA_PC_LIBS_PRIVATE " -lpthread -lm")
if(KVA_HAVE_CUDA)
  string(APPEND KVA_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -lstdc++ -ldl -lrt")
endif()
string(STRIP "${KVA_PC_LIBS_PRIVATE}" KVA_PC_LIBS_PRIVATE)
file(RELATIVE_PATH KVA_PC_TO_PREFIX ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig
     ${CMAKE_INSTALL_PREFIX})
configure_file(cmake/kvattn.pc.in ${PROJECT_BINARY_DIR}/kvattn.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kvattn.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
