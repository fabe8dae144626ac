{
  "targets": [
    {
      "target_name": "wirepool_shm",
      "sources": ["wirepool_shm.c"],
      "cflags": ["-O2", "-Wall", "-Wextra"],
      "defines": ["NAPI_VERSION=8"],
      "conditions": [["OS!='linux'", {"type": "none"}]]
    }
  ]
}
