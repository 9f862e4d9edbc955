#!/usr/bin/env bash
# integration.gpu_bundle_openmpi (issue 30): the Open MPI runtime that scripts/gpu-check.sh carries to the GPU
# machine (which has no Open MPI) works from the bundle alone. `gpu-check.sh openmpi-stage` stages it as `bundle`
# does (mpirun, the components, PMIx's, help texts and parameter files, their libraries); then, in a mount namespace
# where the system's Open MPI runtime is hidden (its components, help texts, parameter files, PMIx's and hwloc's
# folders) and so are ssh and rsh (the GPU machine may have neither), two dptrain ranks train over mpi under the
# bundle's mpirun with `openmpi-env`'s environment, as the GPU check's train_cuda_mpi_2rank steps do (here on the
# CPU). Two controls show the hiding holds: the system's mpirun, and the bundle's without that environment, both fail
# there.
source "$(dirname "$0")/lib/common.bash"
GPU_CHECK=$DPT_SOURCE_DIR/scripts/gpu-check.sh

if ! why=$(unshare -m true 2>&1); then
  echo "skipped: no mount namespace here (unshare -m: $why); the staging alone is not tested"
  exit 77
fi

B=$WORK/bundle
bash "$GPU_CHECK" openmpi-stage "$B" || fail "gpu-check.sh openmpi-stage failed"
[ -x "$B/bin/mpirun" ] || fail "no mpirun staged"
ls "$B"/lib/openmpi/openmpi3/mca_btl_vader.so "$B"/lib/openmpi/openmpi3/mca_pml_ob1.so >/dev/null ||
  fail "the shared-memory components were not staged"
[ -e "$B/lib/libmpi.so.40" ] || fail "libmpi.so.40 was not staged with the components that need it"
for f in "$B"/lib/openmpi/openmpi3/*; do
  [[ $(basename "$f") != *@(ucx|ofi|openib|psm)* ]] || fail "a fabric component was staged: $f"
done
mapfile -t OENV < <(bash "$GPU_CHECK" openmpi-env "$B/lib")
((${#OENV[@]} > 5)) || fail "openmpi-env printed ${#OENV[*]}"

# The system's Open MPI runtime, hidden inside the namespace: empty folders over its folders, /dev/null over ssh and
# rsh. (Its libraries and orterun stay: the staged libraries come first on LD_LIBRARY_PATH, and the system's mpirun
# is the control that must fail without its runtime.)
info_path() { ompi_info --path "$1" --parsable | sed -n "s/^path:$1://p"; }
pmix_lib=$(ldd "$(info_path pkglibdir)/mca_pmix_ext3x.so" | awk '$1 == "libpmix.so.2" { print $3; exit }')
pmix_dir=$(dirname "$(dirname "$(readlink -f "$pmix_lib")")")
mkdir -p "$WORK/empty"
{
  echo "set -e"
  for d in "$(info_path pkglibdir)" "$(info_path pkgdatadir)" "$(info_path sysconfdir)" "$pmix_dir" \
    /usr/lib/x86_64-linux-gnu/hwloc; do
    [ -d "$d" ] && echo "mount --bind '$WORK/empty' '$d'"
  done
  for f in ssh rsh; do
    f=$(command -v "$f" || true)
    [ -n "$f" ] && echo "mount --bind /dev/null '$(readlink -f "$f")'"
  done
  echo 'exec "$@"'
} >"$WORK/hidden.sh"
HIDDEN=(unshare -m bash "$WORK/hidden.sh")

RUN=(--config "$CONFIG" "${SMALL[@]}" dist.backend=mpi train.device=cpu --resume never)
set +e
out=$(timeout 60 "${HIDDEN[@]}" mpirun --oversubscribe --bind-to none -np 2 "$DPTRAIN" "${RUN[@]}" \
  checkpoint.dir="$WORK/system" 2>&1)
rc=$?
set -e
if ((rc == 0 || rc == 126 || rc == 127)) || grep -q "done: " <<<"$out"; then
  echo "$out"
  fail "the system's mpirun ran (or did not start: exit $rc) with its runtime hidden"
fi
echo "ok: the system's mpirun fails with its runtime hidden (exit $rc: $(grep -m1 -E 'rror|unknown' <<<"$out" || true))"

set +e
out=$(timeout 60 "${HIDDEN[@]}" env "LD_LIBRARY_PATH=$B/lib" "$B/bin/mpirun" --oversubscribe --bind-to none -np 2 \
  "$DPTRAIN" "${RUN[@]}" checkpoint.dir="$WORK/bare" 2>&1)
rc=$?
set -e
((rc != 0)) || { echo "$out"; fail "the bundle's mpirun ran without openmpi-env's environment"; }
echo "ok: the bundle's mpirun without openmpi-env's environment fails there (exit $rc)"

out=$(timeout 120 "${HIDDEN[@]}" env "LD_LIBRARY_PATH=$B/lib" "${OENV[@]}" "$B/bin/mpirun" --oversubscribe --bind-to none \
  -np 2 "$DPTRAIN" "${RUN[@]}" checkpoint.dir="$WORK/bundled" 2>&1) ||
  { echo "$out"; fail "two ranks over mpi under the bundle's mpirun failed"; }
<<<"$out" grep -q "done: " || { echo "$out"; fail "no 'done:' line"; }
<<<"$out" grep -qE "couldn't open the help file|failed to add|component_repository_open|unable to open" &&
  { echo "$out"; fail "Open MPI or PMIx warned about its runtime"; }
<<<"$out" grep -m1 "done: "
echo "ok: two ranks over mpi under the bundle's mpirun, the system's runtime hidden"
echo PASS
