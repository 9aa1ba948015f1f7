# device_mpi.sh - sourced by the GPU machine's scripts that need MPI. An
# mpicc on PATH is used as it is (the H100 image of 2026-11-27 had one, with
# its mpirun). Otherwise Debian's Open MPI (fetch the packages here with
#   apt-get download openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 \
#     libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libhwloc15 \
#     libibverbs1 ibverbs-providers librdmacm1 libmunge2 libnl-3-200 libnl-route-3-200 \
#     libnuma1 libpsm-infinipath1 libpsm2-2 libucx0 libatomic1
# ) travels as .deb files in $KVA_MPI_DEBS (default ./.debs-mpi), unpacked
# under /tmp/mx and run relocated there (OPAL_PREFIX; checked on the dev VM
# only). Sets KVA_MPI_ARGS (cmake arguments) and KVA_MPIRUN (the mpirun
# command line for one host; root allowed, as the machine runs commands as
# root), both empty without MPI.
KVA_MPI_ARGS=()
KVA_MPIRUN=
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 # the machine's commands run as root
if command -v mpicc >/dev/null 2>&1; then
  KVA_MPIRUN="mpirun --oversubscribe"
elif ls "${KVA_MPI_DEBS:-.debs-mpi}"/*.deb >/dev/null 2>&1; then
  for f in "${KVA_MPI_DEBS:-.debs-mpi}"/*.deb; do dpkg -x "$f" /tmp/mx; done
  export OPAL_PREFIX=/tmp/mx/usr
  export LD_LIBRARY_PATH=/tmp/mx/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  KVA_MPI_ARGS=(-DMPI_C_COMPILER=/tmp/mx/usr/bin/mpicc.openmpi)
  KVA_MPIRUN="/tmp/mx/usr/bin/orterun --oversubscribe --mca btl self,vader --mca pml ob1"
fi
