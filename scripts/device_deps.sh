# device_deps.sh - sourced by the GPU scripts. A bare GPU machine may lack the
# build dependencies (libssl-dev, libxxhash-dev, libcjson-dev); they can travel
# as .deb files in $KVA_DEBS (default ./.debs), unpacked under /tmp/dx. Sets the
# array KVA_DEP_ARGS (cmake arguments pointing at them; empty when the machine
# has the headers or no .deb files came) and extends LD_LIBRARY_PATH; its own
# variables are named kva_*, so a sourcing script keeps its names.
KVA_DEP_ARGS=()
kva_debs=${KVA_DEBS:-.debs}
if [ -d "$kva_debs" ] && ls "$kva_debs"/*.deb >/dev/null 2>&1 &&
  { [ ! -e /usr/include/openssl/sha.h ] || [ ! -e /usr/include/xxhash.h ] ||
    [ ! -e /usr/include/cjson/cJSON.h ]; }; then
  for kva_deb in "$kva_debs"/*.deb; do dpkg -x "$kva_deb" /tmp/dx; done
  kva_dl=/tmp/dx/usr/lib/x86_64-linux-gnu
  kva_crypto=$(ls /usr/lib/x86_64-linux-gnu/libcrypto.so.3 2>/dev/null || ls $kva_dl/libcrypto.so)
  KVA_DEP_ARGS=(-DOPENSSL_INCLUDE_DIR=/tmp/dx/usr/include -DOPENSSL_CRYPTO_LIBRARY="$kva_crypto"
    -DXXHASH_LIB=$kva_dl/libxxhash.so.0 -DXXHASH_INCLUDE=/tmp/dx/usr/include
    -DCJSON_LIB=$kva_dl/libcjson.so.1 -DCJSON_INCLUDE=/tmp/dx/usr/include
    "-DCMAKE_C_FLAGS=-I/tmp/dx/usr/include -I/tmp/dx/usr/include/x86_64-linux-gnu")
  export LD_LIBRARY_PATH=$kva_dl:${LD_LIBRARY_PATH:-}
fi
