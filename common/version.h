// The project's version, as CMake's project(VERSION) states it (the one place it is written):
// `shardcached --version`, `shardctl --version`, /status and the Debian package all report it.
#pragma once

namespace shardcache {

const char* Version();

}  // namespace shardcache
