# Packaging: install rules for the daemon side (programs, systemd unit, example config,
# sysusers entry) and the CPack setup that turns every install() rule of the project —
# including the client library, headers, pkg-config and CMake package files and the Python
# module, installed by their own CMakeLists — into one Debian package:
#
#   cd build && cpack -G DEB          → shardcache_<version>_<arch>.deb
#
# Layout (Debian paths; the install prefix is /usr):
#   /usr/bin/shardcached, /usr/bin/shardctl
#   /lib/systemd/system/shardcached.service
#   /usr/lib/sysusers.d/shardcache.conf        system user `shardcache`, trainer group
#                                              `shardcache-users`
#   /etc/shardcache/shardcached.toml           conffile (dpkg keeps local edits on upgrade)
#   /usr/lib/<multiarch>/libshardcache.so.*    client library (ldconfig trigger)
#   /usr/share/doc/shardcache/                 copyright, changelog.gz, README, example config,
#                                              optional unit drop-ins
# Maintainer scripts, triggers, copyright and changelog live in deploy/debian/.
include(GNUInstallDirs)

install(TARGETS shardcached shardctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT daemon)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/shardcached.service
  DESTINATION /lib/systemd/system COMPONENT daemon)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/debian/sysusers.conf
  DESTINATION lib/sysusers.d RENAME shardcache.conf COMPONENT daemon)
install(FILES ${PROJECT_SOURCE_DIR}/config/shardcached.toml
  DESTINATION /etc/shardcache COMPONENT daemon)
install(FILES ${PROJECT_SOURCE_DIR}/config/shardcached.toml
  ${PROJECT_SOURCE_DIR}/deploy/systemd/gpu-metrics.conf ${PROJECT_SOURCE_DIR}/README.md
  ${PROJECT_SOURCE_DIR}/deploy/debian/copyright
  DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT daemon)
# Debian policy 12.7: the changelog as changelog.gz, compressed with gzip -9n (no name or
# time stamp, so the package builds reproducibly).
add_custom_command(OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz
  COMMAND sh -c "gzip -9nc '${PROJECT_SOURCE_DIR}/deploy/debian/changelog' > '${CMAKE_CURRENT_BINARY_DIR}/changelog.gz'"
  DEPENDS ${PROJECT_SOURCE_DIR}/deploy/debian/changelog VERBATIM)
add_custom_target(debian_changelog ALL DEPENDS ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT daemon)

set(CPACK_PACKAGE_NAME "shardcache")
set(CPACK_PACKAGE_VENDOR "shardcache")
set(CPACK_PACKAGE_CONTACT "shardcache maintainers <shardcache@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "node-local caching daemon for remote training datasets")
set(CPACK_PACKAGE_DESCRIPTION "shardcached caches remote training datasets on a GPU node's DRAM and NVMe and serves batches to trainers through shared memory; shardctl indexes datasets and operates the daemon; libshardcache and the Python module are the trainer-side client.")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "net")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
# Runtime dependencies (libgrpc++, librocksdb, liburing, ...) computed from the binaries.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_LIBRARY_OUTPUT_DIRECTORY})
# ca-certificates: s3:// and https:// upstreams (libcurl) verify servers with the system's CA
# bundle unless [objstore] ca names one; libcurl4 only recommends it, and the container image
# installs without recommends.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser, ca-certificates")
# A shlibs file, so that programs built against libshardcache depend on this package.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_COMPRESSION_TYPE "gzip")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/deploy/debian/conffiles
  ${PROJECT_SOURCE_DIR}/deploy/debian/postinst
  ${PROJECT_SOURCE_DIR}/deploy/debian/prerm
  ${PROJECT_SOURCE_DIR}/deploy/debian/postrm
  ${PROJECT_SOURCE_DIR}/deploy/debian/triggers)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_GENERATOR "DEB")
include(CPack)
