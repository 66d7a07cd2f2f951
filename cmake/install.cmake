# Installing and packaging (docs/INSTALL.md): `cmake --install` puts the binary, the C++ client
# (header, shared library, CMake package, pkg-config file), the Python package, the docs and a
# systemd unit where Debian expects them; `cpack -G DEB` makes a .deb of the same files.
# scripts/test-package builds the .deb, unpacks it into a fresh root and runs workers from it.

# Debian's multiarch library directory (lib/x86_64-linux-gnu) whatever the prefix: GNUInstallDirs
# picks it only for /usr, but /usr/local/lib/<triplet> is on ld.so's, pkg-config's and CMake's
# search paths too, and the .deb (prefix /usr) must use it even from a build configured for
# /usr/local.
if(NOT DEFINED CMAKE_INSTALL_LIBDIR AND EXISTS /etc/debian_version AND CMAKE_LIBRARY_ARCHITECTURE)
  set(CMAKE_INSTALL_LIBDIR "lib/${CMAKE_LIBRARY_ARCHITECTURE}" CACHE PATH "object code libraries")
endif()
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Where /usr/bin/python3 finds packages under the prefix: Debian's dist-packages for /usr. For a
# prefix of /usr/local, set lib/python3.11/dist-packages (what Debian's python3 searches there).
set(TRAINCOORD_INSTALL_PYTHONDIR "lib/python3/dist-packages" CACHE PATH
    "where the Python package goes, relative to the prefix")

# The version has one truth per language (project() here, pyproject.toml for pip): they must agree.
file(STRINGS "${CMAKE_SOURCE_DIR}/python/pyproject.toml" _py_version REGEX "^version = ")
string(REGEX REPLACE "^version = \"([^\"]*)\"$" "\\1" _py_version "${_py_version}")
if(NOT _py_version STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "python/pyproject.toml says version ${_py_version}, CMakeLists.txt says "
                      "${PROJECT_VERSION}: make them the same")
endif()

# --- The C++ client as a shared library, libtraincoord-client.so.0 -------------------------
# The static traincoord_client, whole, with the core objects it uses; only the public API of
# include/traincoord/client.h is exported (packaging/client_library.map).
set_property(TARGET traincoord_client traincoord_core PROPERTY POSITION_INDEPENDENT_CODE ON)
add_library(traincoord_client_shared SHARED packaging/client_library.cc)
target_link_libraries(traincoord_client_shared
  PUBLIC tl::expected
  PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,traincoord_client>")
target_include_directories(traincoord_client_shared PUBLIC
  "$<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>" "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
target_link_options(traincoord_client_shared PRIVATE
  "LINKER:--version-script=${CMAKE_SOURCE_DIR}/packaging/client_library.map")
# Everything it needs is linked in (not so under sanitizers, whose runtime the program brings).
if(NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  target_link_options(traincoord_client_shared PRIVATE "LINKER:--no-undefined")
endif()
set_target_properties(traincoord_client_shared PROPERTIES
  OUTPUT_NAME traincoord-client VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
  EXPORT_NAME client
  LINK_DEPENDS "${CMAKE_SOURCE_DIR}/packaging/client_library.map")

# --- What goes where -----------------------------------------------------------------------
install(TARGETS traincoord RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# libtraincoord-client.so.0.1.0, its soname link .so.0, and the .so link the linker uses.
install(TARGETS traincoord_client_shared EXPORT traincoord-targets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/traincoord DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# find_package(traincoord) -> traincoord::client.
set(TRAINCOORD_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/traincoord")
install(EXPORT traincoord-targets NAMESPACE traincoord:: DESTINATION ${TRAINCOORD_CMAKEDIR})
configure_package_config_file(cmake/traincoordConfig.cmake.in
  "${CMAKE_BINARY_DIR}/traincoordConfig.cmake" INSTALL_DESTINATION ${TRAINCOORD_CMAKEDIR})
write_basic_package_version_file("${CMAKE_BINARY_DIR}/traincoordConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_BINARY_DIR}/traincoordConfig.cmake"
              "${CMAKE_BINARY_DIR}/traincoordConfigVersion.cmake"
        DESTINATION ${TRAINCOORD_CMAKEDIR})

# pkg-config: traincoord.pc, relocatable (its prefix is found from its own directory).
file(RELATIVE_PATH TRAINCOORD_PC_PREFIX_FROM_PCDIR "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
configure_file(packaging/traincoord.pc.in "${CMAKE_BINARY_DIR}/traincoord.pc" @ONLY)
install(FILES "${CMAKE_BINARY_DIR}/traincoord.pc" DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The Python package, with the metadata pip and importlib.metadata read (as Debian's packages
# ship it: a dist-info without RECORD, so pip leaves it to dpkg).
install(DIRECTORY python/traincoord DESTINATION ${TRAINCOORD_INSTALL_PYTHONDIR}
        FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
file(WRITE "${CMAKE_BINARY_DIR}/python-dist-info/METADATA"
  "Metadata-Version: 2.1\nName: traincoord\nVersion: ${PROJECT_VERSION}\n"
  "Summary: Client for the traincoord training coordinator (standard library only)\n"
  "Requires-Python: >=3.11\nProvides-Extra: torch\nRequires-Dist: torch ; extra == \"torch\"\n")
file(WRITE "${CMAKE_BINARY_DIR}/python-dist-info/top_level.txt" "traincoord\n")
file(WRITE "${CMAKE_BINARY_DIR}/python-dist-info/INSTALLER" "cmake\n")
install(FILES "${CMAKE_BINARY_DIR}/python-dist-info/METADATA"
              "${CMAKE_BINARY_DIR}/python-dist-info/top_level.txt"
              "${CMAKE_BINARY_DIR}/python-dist-info/INSTALLER"
        DESTINATION "${TRAINCOORD_INSTALL_PYTHONDIR}/traincoord-${PROJECT_VERSION}.dist-info")

# Docs, and the examples a new user starts from.
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} FILES_MATCHING PATTERN "*.md")
install(DIRECTORY examples/runs examples/cpp_worker examples/digits
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples PATTERN "__pycache__" EXCLUDE)

# The systemd unit. Written at install time, because its ExecStart names the prefix that is
# installed to (cpack installs to /usr whatever the build was configured for).
install(CODE "
  set(TRAINCOORD_BINDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}\")
  set(TRAINCOORD_DOCDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DOCDIR}\")
  set(unit \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/lib/systemd/system/traincoord.service\")
  message(STATUS \"Installing: \${unit}\")
  configure_file(\"${CMAKE_SOURCE_DIR}/packaging/traincoord.service.in\" \"\${unit}\" @ONLY)
  list(APPEND CMAKE_INSTALL_MANIFEST_FILES \"\${unit}\")
")

# --- The .deb ------------------------------------------------------------------------------
set(CPACK_PACKAGE_NAME traincoord)
set(CPACK_PACKAGE_VENDOR "traincoord")
set(CPACK_PACKAGE_CONTACT "traincoord maintainers <traincoord@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "training coordinator for distributed machine learning")
set(CPACK_PACKAGE_DESCRIPTION
  "One process owns the plan of a training run (epochs, jobs of batches, validation, early
stopping) and hands the work to the workers that ask. This package has the traincoord binary
(coordinator, simulate, status, launch), its systemd unit, the C++ client library with its
header, CMake package and pkg-config file, and the Python client (import traincoord).")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # traincoord_0.1.0-1_amd64.deb
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# The libraries the binary and libtraincoord-client.so link, from dpkg-shlibdeps; python3 for the
# Python package. numpy speeds up sample orders; torch is what training scripts bring.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3 (>= 3.11)")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3-numpy, libexpected-dev")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-torch, libcli11-dev")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA "${CMAKE_SOURCE_DIR}/packaging/deb/prerm")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
