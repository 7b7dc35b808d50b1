#!/bin/sh
# An Open MPI launch agent (`--mca plm_rsh_agent`) that starts a "remote" node's daemon on this machine,
# so a hostfile of several nodes runs for real on one host. Open MPI calls it as ssh:
#   AGENT [options] HOST COMMAND-STRING
# The daemon gets an environment as bare as a fresh ssh login (only PATH, HOME and which node it is):
# everything else a rank sees must come through mpirun's `-x` forwarding.
while [ "${1#-}" != "$1" ]; do shift; done
host="$1"
shift
exec env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="${HOME:-/root}" TRTLLM_TRUSS_TEST_NODE="$host" /bin/sh -c "$*"
