# abdir.sh OLD.so DIR: a cache dir where OLD.so stands in for the current sources' build (SPECMESH_CACHE=DIR)
cd "$(dirname "$0")/../.." && name=$(python -c "
import hashlib; from specmesh.kernels.build import SOURCE, AVX512_SOURCE
print('avx2-' + hashlib.sha256(SOURCE.read_bytes() + AVX512_SOURCE.read_bytes()).hexdigest()[:16] + '.so')")
mkdir -p $2 && cp $1 $2/$name && echo $2/$name
