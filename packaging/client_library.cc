// The shared C++ client library, libtraincoord-client.so, is the static traincoord_client
// linked whole (cmake/install.cmake); a shared library needs one source of its own, and this
// is it. What it exports is listed in client_library.map.
