#!/usr/bin/env bash
# The GPU check: dptrain's GPU path, run on a lent GPU machine that has a GPU, the CUDA toolkit and
# PyTorch, but none of our Debian packages and no internet. See docs/DEVELOPERS.md.
#
#   scripts/gpu-check.sh bundle    HERE (the build machine): build, then make .gpu-bundle/ (< 60 MiB):
#                                  payload.tar.xz (bin/: dptrain, dprun, the test programs, the bench programs
#                                  dpt-model-bench and dpt-allreduce-perf, Open MPI's mpirun; lib/: the shared
#                                  libraries they need that the GPU machine lacks, lib/openmpi/: Open MPI's
#                                  runtime, see stage_openmpi), data/ (Fashion-MNIST), tokens/ (byte-level token
#                                  shards of two of Debian's fortune files, made by the built `dptrain tokenize`),
#                                  configs/, BUNDLE_INFO. Idempotent.
#   scripts/gpu-check.sh run       THERE, from the repository root, with .gpu-bundle carried: unpack, run the
#                                  GPU unit tests (the fast path's again under compute-sanitizer), the other
#                                  unit tests, short trainings (1 rank NCCL, 1 rank CPU, compared; 2 ranks over
#                                  gloo sharing the GPU, fp32 and bf16 all-reduce, and over mpi under the
#                                  bundle's mpirun; 20 steps of them against 1 rank with the doubled batch, and
#                                  of ZeRO 1-3 against DDP, checkpoint against checkpoint;
#                                  configs/fmnist_resnet.toml for 1 epoch in fp32, bf16, fp16; configs/gpt_tiny.toml
#                                  for 50 steps on the GPU and on the CPU, compared, and again with the transformer
#                                  fast path (train.bf16_activations); configs/llama_tiny.toml the same
#                                  ways; the memory report, alone and against PyTorch's max_memory_allocated
#                                  (scripts/bench/torch_memory.py), and an
#                                  out-of-memory message on the GPU) and the benchmarks (the GPT-2
#                                  124M one of scripts/bench/gpt_bench.sh --gpu, the MLP one, then the ResNet rows
#                                  of scripts/bench/resnet_bench.sh --gpu, each with what is left of the budget),
#                                  then print a PASS/FAIL table and write gpu-results.json (the run's record:
#                                  device, commit, steps, benchmark rows; scripts/bench/results.py). Exit status
#                                  non-zero when any step failed. Logs: $OUT/gpu-check.log (everything) and
#                                  $OUT/gpu-check/ (one log per step; packed into gpu-check-logs.tar.xz when OUT
#                                  is set); /tmp/gpu-check/ when OUT is unset.
#   scripts/gpu-check.sh run --only STEP...   THERE: only the steps whose names match these shell patterns
#                                  ('bench_*'); a comparison step needs the runs it compares named too.
#   scripts/gpu-check.sh run --list [--only STEP... | --again]   HERE or THERE: print the steps such a run would
#                                  run, one a line, in its order, and run nothing (no GPU needed; the unit test
#                                  steps as the unpacked bundle has them, else as DPT_BUILD_DIR/tests has them).
#                                  --again reads the last run's table in GPU_CHECK_STATE_DIR (/tmp/gpu-check-state).
#   scripts/gpu-check.sh run --again   THERE, on the same warm machine: the steps of the last run that did not
#                                  PASS (failed, or SKIPPED (budget)), with the runs their comparisons read.
#                                  A step the budget left no time for is recorded as SKIPPED (budget), never PASS.
#                                  Without a GPU (nvidia-smi lists none, no /dev/nvidiaN) run, resnet-bench and
#                                  gpt-bench stop before any step, and run writes no record
#                                  (GPU_CHECK_ALLOW_NO_GPU=1: run the steps anyway; the GPU steps fail).
#   scripts/gpu-check.sh resnet-bench   THERE: only the ResNet benchmark (dpt-model-bench against PyTorch,
#                                  scripts/bench/resnet_bench.sh --gpu) with the bundled programs; its table
#                                  goes to stdout and $OUT/resnet-bench.md (a few minutes).
#   scripts/gpu-check.sh gpt-bench THERE: only the GPT-2 124M benchmark (dpt-model-bench and dptrain against
#                                  PyTorch eager and torch.compile, scripts/bench/gpt_bench.sh --gpu, with the
#                                  per-kernel breakdown) with the bundled programs; its table goes to stdout and
#                                  $OUT/gpt-bench.md (about 5 minutes).
#   scripts/gpu-check.sh unpack    unpack the payload into .gpu-bundle/{bin,lib} (run does it itself; for trying
#                                  the bundle here; `bundle` removes them again so the carried folder stays small)
#   scripts/gpu-check.sh libpath   print the LD_LIBRARY_PATH the bundled programs need on this machine
#   scripts/gpu-check.sh mpirun ARGS...   the bundle's mpirun with its environment (openmpi_env), e.g.
#                                  mpirun -np 2 .gpu-bundle/bin/dptrain ... dist.backend=mpi (after unpack)
#   scripts/gpu-check.sh openmpi-stage DIR   HERE: only Open MPI's runtime and its libraries, into DIR/{bin,lib}
#                                  (integration.gpu_bundle_openmpi); openmpi-env DIR/lib prints its environment
#
# Environment: DPT_BUILD_DIR (default build), DPT_SKIP_BUILD=1 (bundle what is built), GPU_CHECK_BUDGET_S
# (run: seconds for all the steps, default 540; the run ends within ~9.5 minutes, under the device tool's 10-minute
# limit per command), GPU_CHECK_LOSS_TOL / GPU_CHECK_ACC_TOL (default 0.01), GPU_CHECK_GPT_ROWS (bench_gpt's
# gpt_bench.sh BENCH_ROWS; default "fast compile eager fastloop fasttune fastgraph fastloopgraph": not the float32
# activations' step and loop, nor the A/B rows fastnd and fastsep),
# GPU_CHECK_NO_LINKS=1 (run: make no temporary links, see make_compat_links).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd -P)
BUNDLE=.gpu-bundle
MAX_BUNDLE_MIB=60
FMNIST_DIR=/usr/share/datasets/fashion-mnist
FMNIST_FILES=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
# The text of the GPT training check: two of Debian's fortune files (0.37 MB), byte-level tokens (0.74 MB of shards).
FORTUNE_FILES=(/usr/share/games/fortunes/computers /usr/share/games/fortunes/science)

die() { echo "gpu-check: error: $*" >&2; exit 1; }

# --------------------------------------------------------------------------------------------------------
# bundle (build machine)
# --------------------------------------------------------------------------------------------------------

# What to do with a shared library ldd names, by its name: glibc (never carried: it must be the machine's
# own, with its loader), driver (libcuda, libnvidia-*: always the machine's), cuda (CUDA's big libraries: the
# machine's toolkit or PyTorch's NVIDIA wheels provide them), compat (libstdc++, libgcc_s: the machine's
# are newer; carried in lib/compat/, used only when the machine's turn out too old), carry (the rest).
# cuDNN is "cuda" too: its libraries are hundreds of MB (the bundle must stay under 60 MiB); the GPU machine has
# it from PyTorch's wheels (nvidia/cudnn/lib), which cuda_lib_dirs finds.
lib_class() {
  local base=${1%%.so*}
  case $base in
    linux-vdso | linux-gate | ld-linux* | libc | libm | libmvec | libpthread | libdl | librt | libresolv | \
      libutil | libanl | libnsl | libBrokenLocale | libnss_* | libthread_db | libc_malloc_debug) echo glibc ;;
    libcuda | libnvidia-* | libnvcuvid) echo driver ;;
    libcudart | libcublas | libcublasLt | libnccl | libnvrtc* | libnvJitLink | libcurand | libcusparse* | \
      libcusolver* | libcufft* | libnvToolsExt | libnvtx* | libcupti | libcudnn*) echo cuda ;;
    libstdc++ | libgcc_s) echo compat ;;
    *) echo carry ;;
  esac
}

# Open MPI's runtime, for the steps that run two ranks over mpi (the GPU machine has no Open MPI): Debian's mpirun
# (orterun), the MCA components that need no fabric library (those for UCX, libfabric, verbs, PSM and netlink stay
# behind, with OpenSHMEM's: ranks sharing one machine talk over shared memory, and Debian's parameter file turns most
# of them off),
# PMIx's components, the help texts and the parameter files, under lib/openmpi/ of DEST (openmpi_env names the
# folders). Prints mpirun's and the components' paths, one a line: the bundle carries the libraries they need.
OMPI_FABRIC_LIBS='^(libuc[mpst]|libpsm|libibverbs|librdmacm|libfabric|libefa|libinfinipath|libnl-|liboshmem|'
OMPI_FABRIC_LIBS+='libmca_common_(ucx|ofi|verbs))'
stage_openmpi() {
  local dest=$1 orterun pkglibdir pkgdatadir sysconfdir pmix f deps
  orterun=$(command -v orterun || true)
  if [ -z "$orterun" ] || ! command -v ompi_info >/dev/null; then
    die "no orterun or ompi_info (apt-get install openmpi-bin)"
  fi
  pkglibdir=$(ompi_info --path pkglibdir --parsable | sed -n 's/^path:pkglibdir://p')
  pkgdatadir=$(ompi_info --path pkgdatadir --parsable | sed -n 's/^path:pkgdatadir://p')
  sysconfdir=$(ompi_info --path sysconfdir --parsable | sed -n 's/^path:sysconfdir://p')
  # PMIx's folder: two up from the library the PMIx component links (Debian: .../pmix2/lib/libpmix.so.2.6.2).
  pmix=$(ldd "$pkglibdir/mca_pmix_ext3x.so" 2>/dev/null | awk '$1 == "libpmix.so.2" { print $3; exit }' || true)
  [ -z "$pmix" ] || pmix=$(dirname "$(dirname "$(readlink -f "$pmix")")")
  if [ ! -d "$pkglibdir" ] || [ ! -d "$pkgdatadir" ] || [ ! -f "$sysconfdir/openmpi-mca-params.conf" ] ||
    [ ! -d "$pmix/lib/pmix" ]; then
    die "Open MPI's folders are not where ompi_info says ($pkglibdir, $pkgdatadir, $sysconfdir) or no $pmix/lib/pmix"
  fi
  local o=$dest/lib/openmpi
  rm -rf "$o"  # staged afresh (copying the help texts' folder again would nest it)
  mkdir -p "$dest/bin" "$o/openmpi3" "$o/share" "$o/etc" "$o/pmix/lib"
  cp -p "$orterun" "$dest/bin/mpirun"
  echo "$orterun"
  for f in "$pkglibdir"/*.so; do
    deps=$(ldd "$f" | awk '{ print $1 }')
    grep -qE "$OMPI_FABRIC_LIBS" <<<"$deps" && continue
    cp -p "$f" "$o/openmpi3/"
    echo "$f"
  done
  cp -pr "$pkgdatadir" "$o/share/openmpi"
  cp -p "$sysconfdir"/* "$o/etc/"
  cp -pr "$pmix/lib/pmix" "$o/pmix/lib/"  # its components (libpmix itself: a library like the others)
  cp -pr "$pmix/share" "$o/pmix/"
  find "$pmix/lib/pmix" -name '*.so' | sort
}

bundle() {
  local build_dir=${DPT_BUILD_DIR:-build}
  if [ "${DPT_SKIP_BUILD:-0}" = 1 ]; then
    echo "gpu-check: DPT_SKIP_BUILD=1: bundling what is in $build_dir"
  else
    bash scripts/build.sh
  fi
  if [ ! -x "$build_dir/trainer/dptrain" ] || [ ! -x "$build_dir/launcher/dprun" ]; then
    die "$build_dir/trainer/dptrain or $build_dir/launcher/dprun is missing: did the build fail?"
  fi
  local f
  for f in "${FMNIST_FILES[@]}"; do
    [ -f "$FMNIST_DIR/$f" ] || die "$FMNIST_DIR/$f is missing (apt-get install dataset-fashion-mnist)"
  done

  # The programs: dptrain, dprun, the benchmark programs (bench/: dpt-model-bench, dpt-allreduce-perf) and every
  # test executable in the build tree.
  [ -x "$build_dir/bench/dpt-model-bench" ] ||
    die "$build_dir/bench/dpt-model-bench is missing (the ResNet benchmark needs it): did the build fail?"
  local bins=("$build_dir/trainer/dptrain" "$build_dir/launcher/dprun")
  while IFS= read -r f; do bins+=("$f"); done < <(
    find "$build_dir" -name CMakeFiles -prune -o -type f -perm -u+x \( -name 'unit_*' -o -name 'mpi_*' -o \
      -path "*/bench/dpt-*" -o -name dpt-c10d-store-check \) -print | sort)
  local dups
  dups=$(for f in "${bins[@]}"; do basename "$f"; done | sort | uniq -d)
  [ -z "$dups" ] || die "two programs with the same name in $build_dir: $dups"

  STAGE=$(mktemp -d)
  trap 'rm -rf "$STAGE"' EXIT
  mkdir -p "$STAGE/bin" "$STAGE/lib/compat"
  cp -p "${bins[@]}" "$STAGE/bin/"
  local ompi_objs=()
  stage_openmpi "$STAGE" >"$STAGE/openmpi-objects"  # (outside bin/ and lib/: not in the payload)
  mapfile -t ompi_objs <"$STAGE/openmpi-objects"

  # The shared libraries: ldd lists the whole closure. Copy each (dereferenced) under its soname.
  local -A carried=() compat=() cuda=()
  local name path line missing=()
  for f in "${bins[@]}" "${ompi_objs[@]}"; do
    while read -r name path; do
      case $(lib_class "$name") in
        glibc | driver) ;;  # the machine's own
        cuda) cuda[$name]=1 ;;
        compat) [ "$path" != "not" ] && compat[$name]=$path ;;
        carry)
          if [ "$path" = "not" ]; then missing+=("$name (needed by $(basename "$f"))"); else carried[$name]=$path; fi ;;
      esac
    done < <(ldd "$f" | awk '$2 == "=>" { print $1, $3; next } $1 ~ /^\// { n = split($1, p, "/"); print p[n], $1 }')
  done
  ((${#missing[@]} == 0)) || die "ldd finds no ${missing[*]}"
  for name in "${!carried[@]}"; do cp -L "${carried[$name]}" "$STAGE/lib/$name"; done
  for name in "${!compat[@]}"; do cp -L "${compat[$name]}" "$STAGE/lib/compat/$name"; done
  chmod -R u+w "$STAGE"

  # What the machine's glibc / libstdc++ must provide, for the check on the other side.
  local glibc_need glibcxx_need
  local objs=("$STAGE"/bin/* "$STAGE"/lib/*.so*)
  mapfile -t -O "${#objs[@]}" objs < <(find "$STAGE/lib/openmpi" -name '*.so' | sort)  # the components too
  glibc_need=$(objdump -T "${objs[@]}" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
  glibcxx_need=$(objdump -T "${objs[@]}" 2>/dev/null | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -1)

  # The payload: a reproducible tar (sorted, fixed owners and times), xz-compressed (OpenBLAS alone is
  # 36 MB, 4 MB compressed: uncompressed, programs + libraries + data would not fit the carry limit).
  # Compressed again only when the tar changed.
  mkdir -p "$BUNDLE"
  rm -rf "${BUNDLE:?}/bin" "${BUNDLE:?}/lib" "$BUNDLE/.unpacked"  # left by `unpack`: not to be carried
  local tarfile="$STAGE/payload.tar" sha
  tar -C "$STAGE" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$tarfile" bin lib
  sha=$(sha256sum "$tarfile" | cut -d' ' -f1)
  if [ -f "$BUNDLE/payload.tar.xz" ] && [ "$(cat "$BUNDLE/payload.sha256" 2>/dev/null)" = "$sha" ]; then
    echo "gpu-check: payload unchanged"
  else
    # -9 in one thread: one stream with a 64 MiB window, in which the programs' copies of the same CUDA kernels
    # and libraries compress against each other (-6 -T0 cut it into blocks and carried 6 MB more: over the limit).
    echo "gpu-check: compressing the payload (xz -9, about 90 s)"
    xz -9 -T1 -c "$tarfile" >"$BUNDLE/payload.tar.xz.tmp"
    mv "$BUNDLE/payload.tar.xz.tmp" "$BUNDLE/payload.tar.xz"
    echo "$sha" >"$BUNDLE/payload.sha256"
  fi

  mkdir -p "$BUNDLE/data" "$BUNDLE/configs"
  for f in "${FMNIST_FILES[@]}"; do
    cmp -s "$FMNIST_DIR/$f" "$BUNDLE/data/$f" || cp "$FMNIST_DIR/$f" "$BUNDLE/data/$f"
  done
  rm -f "$BUNDLE"/configs/*
  cp configs/*.toml "$BUNDLE/configs/"

  # Token shards for the GPT training check (train_cuda_gpt / train_cpu_gpt), written by the dptrain being
  # bundled; without the fortune files the bundle goes without them and those steps say so there.
  local tokens_note="none (no ${FORTUNE_FILES[*]}: apt-get install fortunes)"
  rm -rf "$BUNDLE/tokens"
  if [ -f "${FORTUNE_FILES[0]}" ] && [ -f "${FORTUNE_FILES[1]}" ]; then
    local tok_args=() tlog
    for f in "${FORTUNE_FILES[@]}"; do tok_args+=(--input "$f"); done
    tlog=$(mktemp)
    if "$build_dir/trainer/dptrain" tokenize "${tok_args[@]}" --out "$BUNDLE/tokens" >"$tlog" 2>&1; then
      tokens_note="$(du -sh "$BUNDLE/tokens" | cut -f1) ($(cd "$BUNDLE/tokens" && echo *), from $(basename -a "${FORTUNE_FILES[@]}" | tr '\n' ' ' | sed 's/ $//'))"
    else
      cat "$tlog" >&2
      rm -rf "$BUNDLE/tokens"
      die "dptrain tokenize failed (above)"
    fi
    rm -f "$tlog"
  fi

  local source_dir cuda_build=no cudnn_version=none cudnn_inc
  source_dir=$(sed -n 's/^dptrain_SOURCE_DIR:STATIC=//p' "$build_dir/CMakeCache.txt" 2>/dev/null || true)
  cudnn_inc=$(sed -n 's/^CUDNN_INCLUDE_DIR:PATH=//p' "$build_dir/CMakeCache.txt" 2>/dev/null || true)
  if [ -n "${cuda[libcudnn.so.9]:-}" ] && [ -f "$cudnn_inc/cudnn_version.h" ]; then
    cudnn_version=$(awk '/^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) / { v = v (v == "" ? "" : ".") $3 } END { print v }' \
      "$cudnn_inc/cudnn_version.h")
  fi
  if [ -x "$STAGE/bin/unit_gpu" ] || [ -n "${cuda[libnccl.so.2]:-}" ]; then cuda_build=yes; fi
  {
    echo "# Written by scripts/gpu-check.sh bundle; read by scripts/gpu-check.sh run."
    echo "created=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "git_head=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "git_head_full=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "cuda_version=$( (/usr/local/cuda/bin/nvcc --version 2>/dev/null || true) | sed -n 's/.*release \([0-9.]*\),.*/\1/p' | head -1)"
    echo "git_changed_files=$(git status --porcelain 2>/dev/null | wc -l)"
    echo "build_dir=$build_dir"
    echo "source_dir=$source_dir"
    echo "cuda_build=$cuda_build"
    echo "cudnn_version=$cudnn_version"
    echo "programs=$(cd "$STAGE/bin" && echo *)"
    echo "libs=$(printf '%s\n' "${!carried[@]}" | sort | tr '\n' ' ')"
    echo "compat_libs=$(printf '%s\n' "${!compat[@]}" | sort | tr '\n' ' ')"
    echo "machine_cuda_libs=$(printf '%s\n' "${!cuda[@]}" | sort | tr '\n' ' ')"
    echo "glibc_needed=${glibc_need#GLIBC_}"
    echo "glibcxx_needed=${glibcxx_need#GLIBCXX_}"
    echo "payload_sha256=$sha"
  } >"$BUNDLE/BUNDLE_INFO"

  # Summary and the size limit (the device tool carries 64 MiB at most).
  local bytes mib
  bytes=$(du -sb "$BUNDLE" | cut -f1)
  mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
  echo
  echo "gpu-check: $BUNDLE ready"
  echo "  programs      : $(cd "$STAGE/bin" && echo *)"
  echo "  libraries     : ${#carried[@]} carried ($(du -sh "$STAGE/lib" | cut -f1) uncompressed, compat/ included): $(printf '%s\n' "${!carried[@]}" | sort | tr '\n' ' ')"
  echo "  compat (used only if the machine's are older): $(printf '%s\n' "${!compat[@]}" | sort | tr '\n' ' ')"
  local from_machine="${!cuda[*]}"
  echo "  from the GPU machine: ${from_machine:-no CUDA library} (and the driver, glibc)"
  echo "  needs glibc >= ${glibc_need#GLIBC_}, libstdc++ with ${glibcxx_need:-nothing}"
  echo "  payload       : $(du -h "$BUNDLE/payload.tar.xz" | cut -f1) ($(du -h "$tarfile" | cut -f1) uncompressed)"
  echo "  data          : $(du -sh "$BUNDLE/data" | cut -f1) (${FMNIST_FILES[*]})"
  echo "  tokens        : $tokens_note"
  echo "  configs       : $(cd "$BUNDLE/configs" && echo *)"
  [ "$cuda_build" = yes ] || echo "  WARNING: CPU-only build (no unit_gpu, no NCCL): the GPU steps will fail there"
  echo "  total         : $mib MiB (limit $MAX_BUNDLE_MIB MiB)"
  if ((bytes > MAX_BUNDLE_MIB * 1048576)); then
    die "$BUNDLE is $mib MiB, over the $MAX_BUNDLE_MIB MiB limit"
  fi
  echo "Carry it: run(command='bash scripts/gpu-check.sh run', carry=['$BUNDLE'])"
}

# --------------------------------------------------------------------------------------------------------
# unpack / libpath (GPU machine)
# --------------------------------------------------------------------------------------------------------

info_get() { sed -n "s/^$1=//p" "$BUNDLE/BUNDLE_INFO" 2>/dev/null | head -1 || true; }

# Unpacks the payload into .gpu-bundle/{bin,lib} (into $TMPDIR when .gpu-bundle is not writable), once per
# payload. Sets B_DIR, B_BIN, B_LIB.
unpack_bundle() {
  if [ ! -f "$BUNDLE/payload.tar.xz" ] || [ ! -f "$BUNDLE/payload.sha256" ]; then
    die "no $BUNDLE/payload.tar.xz: run 'bash scripts/gpu-check.sh bundle' on the build machine and carry $BUNDLE"
  fi
  local sha
  sha=$(cat "$BUNDLE/payload.sha256")
  B_DIR=$BUNDLE
  if ! { touch "$BUNDLE/.write-test" && rm -f "$BUNDLE/.write-test"; } 2>/dev/null; then
    B_DIR=${TMPDIR:-/tmp}/dpt-gpu-bundle
  fi
  B_BIN=$B_DIR/bin
  B_LIB=$B_DIR/lib
  if [ -d "$B_BIN" ] && [ "$(cat "$B_DIR/.unpacked" 2>/dev/null)" = "$sha" ]; then return 0; fi
  rm -rf "$B_BIN" "$B_LIB"
  mkdir -p "$B_DIR"
  if command -v xz >/dev/null 2>&1; then
    tar -C "$B_DIR" -xJf "$BUNDLE/payload.tar.xz"
  else  # no xz program: Python's tarfile reads xz too
    python3 -c 'import sys, tarfile
kw = {"filter": "fully_trusted"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], **kw)' "$BUNDLE/payload.tar.xz" "$B_DIR"
  fi
  echo "$sha" >"$B_DIR/.unpacked"
}

# The machine's CUDA library folders, one a line, best first: the toolkit's, then the NVIDIA wheels next to
# PyTorch (CUDA 12 wheels: nvidia/{cublas,cuda_runtime,nccl,cuda_nvrtc}/lib; CUDA 13 wheels: nvidia/cu13/lib,
# and nvidia/nccl/lib for NCCL; cuDNN 9 in nvidia/cudnn/lib for both). Only folders holding cuBLAS, NCCL, the
# CUDA runtime, cuDNN or NVRTC (which cuDNN's runtime-compiled engines load).
cuda_lib_dirs() {
  {
    local d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
      /usr/local/cuda/extras/CUPTI/lib64; do  # the last: CUPTI, for dpt-model-bench --trace-steps (dlopen)
      [ -d "$d" ] && echo "$d"
    done
    if command -v python3 >/dev/null 2>&1; then
      python3 - <<'EOF' 2>/dev/null || true
import glob, importlib, os
want = ("libcublas.so", "libcublasLt.so", "libnccl.so", "libcudart.so", "libcudnn.so", "libnvrtc.so", "libcupti.so")
roots = []
for mod in ("nvidia", "nvidia.cu13", "nvidia.nccl", "nvidia.cublas", "nvidia.cuda_runtime", "nvidia.cudnn",
            "nvidia.cuda_cupti"):
    try:
        m = importlib.import_module(mod)
    except Exception:
        continue
    for p in list(getattr(m, "__path__", [])) or [os.path.dirname(m.__file__ or "")]:
        roots += [p] + sorted(glob.glob(os.path.join(p, "*")))
for r in roots:
    lib = os.path.join(r, "lib")
    if os.path.isdir(lib) and any(n.startswith(w) for n in os.listdir(lib) for w in want):
        print(lib)
EOF
    fi
  } | while read -r d; do
    if [ -d "$d" ]; then readlink -f "$d"; fi
  done | awk '!seen[$0]++'
}

# Sets DPT_LD: the LD_LIBRARY_PATH of the bundled programs (bundle lib/, lib/compat/ only when the machine's
# libstdc++ is too old, the CUDA folders). Only our programs get it: python3 (PyTorch) and nvidia-smi keep
# the machine's own libraries.
setup_libpath() {
  local cuda_dirs base probe_err
  cuda_dirs=$(cuda_lib_dirs | paste -sd: -)
  base=$ROOT/$B_LIB${cuda_dirs:+:$cuda_dirs}
  DPT_LD=$base
  USING_COMPAT=no
  probe_err=$(mktemp)
  if ! env LD_LIBRARY_PATH="$base" "$B_BIN/dptrain" --help >/dev/null 2>"$probe_err" &&
    grep -qE 'GLIBCXX_|CXXABI_|GCC_[0-9]' "$probe_err"; then
    DPT_LD=$ROOT/$B_LIB:$ROOT/$B_LIB/compat${cuda_dirs:+:$cuda_dirs}
    USING_COMPAT=yes
  fi
  rm -f "$probe_err"
}

# The environment (NAME=value, one a line) under which the Open MPI that stage_openmpi put in LIB (the bundle's
# lib/, an absolute path) runs from there: its folders for Open MPI's and PMIx's own lookups (each named, since
# Debian's are not all under one prefix; PMIx's parameter file names its components' folder, which the environment
# overrides), root allowed (the GPU machine runs us as root), shared memory without single-copy (CMA's
# process_vm_readv, which a container's seccomp profile may refuse: copy-in/copy-out works anywhere), and the local
# launcher alone (plm isolated: mpirun's default one wants an ssh or rsh program even for local ranks, and the GPU
# machine may have neither). mpirun passes its
# environment on to the ranks it starts, whose libmpi loads its components the same way.
openmpi_env() {
  local lib=$1 o=$1/openmpi
  printf '%s\n' "OPAL_PREFIX=$o" "OPAL_EXEC_PREFIX=$o" "OPAL_LIBDIR=$lib" "OPAL_PKGLIBDIR=$o/openmpi3" \
    "OPAL_DATADIR=$o/share" "OPAL_PKGDATADIR=$o/share/openmpi" "OPAL_SYSCONFDIR=$o/etc" \
    "PMIX_PREFIX=$o/pmix" "PMIX_EXEC_PREFIX=$o/pmix" "PMIX_LIBDIR=$o/pmix/lib" "PMIX_PKGLIBDIR=$o/pmix/lib/pmix" \
    "PMIX_DATADIR=$o/pmix/share" "PMIX_PKGDATADIR=$o/pmix/share/pmix" "PMIX_SYSCONFDIR=$o/pmix/share" \
    "PMIX_MCA_mca_base_component_path=$o/pmix/lib/pmix" \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none \
    OMPI_MCA_plm=isolated
}

# For the tests (integration.gpu_bundle_openmpi): stage_openmpi into DEST with the libraries mpirun and the
# components need (those glibc and the driver do not give) in DEST/lib, as the bundle carries them.
openmpi_stage_only() {
  local dest=$1 f name path
  [ -n "$dest" ] || die "openmpi-stage needs a folder"
  mkdir -p "$dest/lib"
  stage_openmpi "$dest" >"$dest/openmpi-objects"
  while read -r f; do
    while read -r name path; do
      case $(lib_class "$name") in
        carry) [ "$path" = "not" ] || [ -e "$dest/lib/$name" ] || cp -L "$path" "$dest/lib/$name" ;;
      esac
    done < <(ldd "$f" | awk '$2 == "=>" { print $1, $3 }')
  done <"$dest/openmpi-objects"
}

# Sets OMPI_ENV: openmpi_env for the unpacked bundle's lib/; and MPIRUN2: the two-rank mpi steps' launcher (the
# bundle's mpirun with that environment and DPT_ENV's libraries).
bundle_openmpi_env() {
  local lib=$B_LIB
  [[ $lib == /* ]] || lib=$ROOT/$lib
  mapfile -t OMPI_ENV < <(openmpi_env "$lib")
  MPIRUN2=("${DPT_ENV[@]}" "${OMPI_ENV[@]}" "$B_BIN/mpirun" --oversubscribe --bind-to none -np 2)
}

# --------------------------------------------------------------------------------------------------------
# run (GPU machine)
# --------------------------------------------------------------------------------------------------------

LOG_ROOT=${OUT:-/tmp/gpu-check}
STEP_DIR=$LOG_ROOT/gpu-check
MAIN_LOG=$LOG_ROOT/gpu-check.log
WORK=/tmp/gc
LOSS_TOL=${GPU_CHECK_LOSS_TOL:-0.01}
ACC_TOL=${GPU_CHECK_ACC_TOL:-0.01}
STEP_NAMES=()
STEP_RESULTS=()
STEP_SECONDS=()
STEP_NOTES=()
NOTE=""
RUN_STATUS=""
RUN_STARTED=0  # whether the current step started any command (else a failure for lack of budget is SKIPPED)
LINKS_MADE=()

log() { printf '%s\n' "$*" | tee -a "$MAIN_LOG"; }

# run_timed LOGFILE LIMIT_S CMD...: runs CMD, its output appended to LOGFILE, under LIMIT_S seconds or what is
# left of the budget if less. Returns CMD's exit status (124: timed out; also when no time was left, and
# then RUN_STATUS says which).
run_timed() {
  local logfile=$1 limit=$2 left rc=0
  shift 2
  left=$((DEADLINE - $(date +%s) - 10))
  if ((left < 15)); then
    RUN_STATUS="not started: the budget (GPU_CHECK_BUDGET_S=$BUDGET) is spent"
    echo "$RUN_STATUS" >>"$logfile"
    return 124
  fi
  ((limit <= left)) || limit=$left
  RUN_STARTED=1
  echo "\$ $* (timeout ${limit}s)" >>"$logfile"
  timeout -k 10 "$limit" "$@" >>"$logfile" 2>&1 </dev/null || rc=$?
  if ((rc == 124 || rc == 137)); then
    RUN_STATUS="TIMED OUT after ${limit}s"
    echo "$RUN_STATUS" >>"$logfile"
  fi
  echo "exit status $rc" >>"$logfile"
  return "$rc"
}

# Which steps run: all, or (run --only PATTERN...) those whose name matches one of the shell patterns, or (run
# --again) those of the last run on this machine that did not PASS, with the runs a comparison reads
# (again_groups). Every run leaves its step table in STATE_DIR for --again (the machine stays warm between calls
# for a short while, and $OUT is emptied before each).
STATE_DIR=${GPU_CHECK_STATE_DIR:-/tmp/gpu-check-state}
ONLY=()
LIST_ONLY=0  # run --list: run_step prints the selected steps' names instead of running them
selected() {
  ((${#ONLY[@]})) || return 0
  local p
  for p in "${ONLY[@]}"; do
    # shellcheck disable=SC2053  # a pattern on purpose
    [[ $1 == $p ]] && return 0
  done
  return 1
}

# Steps that must run together: a comparison reads the logs of the two runs before it.
again_groups() {
  cat <<'GROUPS'
train_cuda_nccl_1rank train_cpu_1rank compare_gpu_cpu
train_cuda_gpt train_cpu_gpt compare_gpt_gpu_cpu generate_gpu_cpu
train_cuda_gpt_bf16act train_cpu_gpt_bf16act compare_gpt_bf16act_gpu_cpu
train_cuda_gpt_autotune train_cpu_gpt_bf16act compare_gpt_autotune_gpu_cpu
train_cuda_gpt_bf16act train_cuda_gpt_graph compare_gpt_graph_eager
train_cuda_llama train_cpu_llama compare_llama_gpu_cpu
train_cuda_resnet_fp32 predict_gpu_cpu
equiv_cuda_1rank_b128 equiv_cuda_gloo_2rank equiv_cuda_mpi_2rank
equiv_cuda_1rank_b128 equiv_cuda_gloo_2rank equiv_cuda_gloo_2rank_zero1 equiv_cuda_gloo_2rank_zero2 equiv_cuda_gloo_2rank_zero3
train_cuda_llama_bf16act train_cpu_llama_bf16act compare_llama_bf16act_gpu_cpu
GROUPS
}

# Sets ONLY to the steps of STATE_DIR/steps.tsv that did not PASS, and their groups' other steps.
select_again() {
  local state=$STATE_DIR/steps.tsv name result rest group g
  [ -s "$state" ] || die "run --again: no earlier run's $state on this machine (a fresh machine keeps nothing): use run or run --only"
  while IFS=$'\t' read -r name result rest; do
    [ "$result" = PASS ] && continue
    ONLY+=("$name")
    while read -r group; do
      [[ " $group " == *" $name "* ]] || continue
      for g in $group; do ONLY+=("$g"); done
    done < <(again_groups)
  done <"$state"
  ((${#ONLY[@]})) || die "run --again: every step of the last run passed"
  mapfile -t ONLY < <(printf '%s\n' "${ONLY[@]}" | sort -u)
  log "run --again: $(printf '%s\n' "${ONLY[@]}" | sort -u | tr '\n' ' ')"
}

# Steps that need no GPU (the CPU halves of the GPU-against-CPU comparisons, the CPU unit tests that start no
# network or processes) run beside the GPU steps from the start, in the background with 2 threads each (the GPU
# machine has 16 cores; the GPU steps use one or two): start_background launches one, and its run_step, at its
# place in the order, waits for it and records it like any other step (its own time, its log, its note). Before the
# benchmarks every background step has finished (wait_background), so none of them shares the machine with a timing.
# The GPU steps themselves run in lanes (start_lane): each lane's steps one after another, the lanes side by side,
# since each step is a small job that leaves most of the GPU and the machine idle (run one after another, the steps
# before the benchmarks took most of the budget); their run_steps wait for them in the same way.
declare -A BG_PID=() BG_LANE=()
LANES=0
BG_THREADS=(OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 MKL_NUM_THREADS=2)
# background_body NAME FUNCTION [ARGS...]: runs the step here (in a subshell of its own) and leaves its result in
# $STEP_DIR/NAME.background for join_background; returns its status.
background_body() {
  local name=$1 fn=$2 rc=0
  shift 2
  local logfile=$STEP_DIR/$name.log result=$STEP_DIR/$name.background
  (
    NOTE="" RUN_STATUS="" RUN_STARTED=0
    DPT_ENV=("${DPT_ENV[@]}" "${BG_THREADS[@]}")
    begin=$(date +%s) rc=0
    "$fn" "$logfile" "$@" || rc=$?
    printf '%s\n%s\n%s\n%s\n%s\n' "$rc" "$(($(date +%s) - begin))" "$RUN_STARTED" "$RUN_STATUS" "$NOTE" >"$result.tmp"
    mv "$result.tmp" "$result"
    exit "$rc"
  ) || rc=$?
  return "$rc"
}
start_background() {  # NAME FUNCTION [ARGS...]
  local name=$1
  ((LIST_ONLY == 0)) && selected "$name" || return 0
  : >"$STEP_DIR/$name.log"
  rm -f "$STEP_DIR/$name.background" "$STEP_DIR/$name.background.tmp"
  background_body "$@" &
  BG_PID[$name]=$!
}
# start_lane "NAME FUNCTION [ARGS...]"...: the selected steps among these, one after another in one background
# subshell (arguments split at spaces: no argument of a step has one). A step that reads another's output
# (passed_in_this_run) must be in its lane, after it; a comparison of two lanes' runs stays in the foreground.
start_lane() {
  local spec words names=() n
  ((LIST_ONLY == 0)) || return 0
  for spec in "$@"; do
    read -ra words <<<"$spec"
    selected "${words[0]}" && names+=("${words[0]}")
  done
  ((${#names[@]})) || return 0
  for n in "${names[@]}"; do
    : >"$STEP_DIR/$n.log"
    rm -f "$STEP_DIR/$n.background" "$STEP_DIR/$n.background.tmp"
  done
  (
    for spec in "$@"; do
      read -ra words <<<"$spec"
      selected "${words[0]}" || continue
      if background_body "${words[@]}"; then STEP_RESULTS+=(PASS); else STEP_RESULTS+=(FAIL); fi
      STEP_NAMES+=("${words[0]}")  # for passed_in_this_run in the lane's later steps
    done
  ) &
  LANES=$((LANES + 1))
  for n in "${names[@]}"; do
    BG_PID[$n]=$!
    BG_LANE[$n]=$LANES
  done
}
# join_background NAME: waits for NAME's background run; sets NOTE, RUN_STATUS, RUN_STARTED and BG_TOOK from it and
# returns 0 when it passed.
join_background() {
  local name=$1 result=$STEP_DIR/$1.background rc pid=${BG_PID[$1]} lane=${BG_LANE[$1]:-}
  # A lane goes on with its next steps: its result file, not its end, says this step is done.
  while [ ! -e "$result" ] && kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  [ -n "$lane" ] || wait "$pid" 2>/dev/null || true
  unset "BG_PID[$name]" "BG_LANE[$name]"
  BG_TOOK=0
  if [ ! -s "$result" ]; then
    NOTE="its background run left no result (killed?)"
    return 1
  fi
  { read -r rc; read -r BG_TOOK; read -r RUN_STARTED; read -r RUN_STATUS; read -r NOTE; } <"$result"
  if [ -n "$lane" ]; then NOTE="${NOTE:+$NOTE; }GPU lane $lane"; else NOTE="${NOTE:+$NOTE; }beside the GPU steps"; fi
  return $((rc != 0))
}
# wait_background: every background step finished (their results stay for their run_step).
wait_background() {
  local pid
  for pid in "${BG_PID[@]}"; do wait "$pid" 2>/dev/null || true; done
}

# run_step NAME FUNCTION [ARGS...]: runs one step; FUNCTION gets its log file first and sets NOTE. A failed
# step is recorded (and its log's tail shown), never fatal. A step start_background launched is waited for instead.
run_step() {
  local name=$1 fn=$2 start result took
  shift 2
  selected "$name" || return 0
  if ((LIST_ONLY)); then
    echo "$name"
    STEP_NAMES+=("$name")
    return 0
  fi
  local logfile=$STEP_DIR/$name.log
  NOTE=""
  RUN_STATUS=""
  RUN_STARTED=0
  start=$(date +%s)
  log ""
  log "==== $name"
  if [ -n "${BG_PID[$name]:-}" ]; then
    if join_background "$name"; then result=PASS; else result=FAIL; fi
    took=$BG_TOOK
  else
    : >"$logfile"
    if "$fn" "$logfile" "$@"; then result=PASS; else result=FAIL; fi
    took=$(($(date +%s) - start))
  fi
  # A step the budget left no time for is SKIPPED (budget), never PASS, and is not counted as run; one that started a
  # command and failed stays FAIL even when a later command of it found no time left.
  if [ "$result" = FAIL ] && ((RUN_STARTED == 0)) && [[ $RUN_STATUS == "not started"* || $NOTE == "not started"* ]]; then
    result="SKIPPED (budget)"
  fi
  [ -z "$RUN_STATUS" ] || NOTE="$RUN_STATUS; $NOTE"
  {
    echo "---- $name: output ($logfile)"
    cat "$logfile"
    echo "---- $name: end"
  } >>"$MAIN_LOG"
  if [ "$result" = FAIL ]; then
    echo "     last lines of $logfile:"
    tail -n 25 "$logfile" | sed 's/^/     | /'
  fi
  log "==== $name: $result (${took}s) $NOTE"
  STEP_NAMES+=("$name")
  STEP_RESULTS+=("$result")
  STEP_SECONDS+=("$took")
  STEP_NOTES+=("$NOTE")
}

# Parsing dptrain's output. An epoch line: "... epoch 1/1 loss 0.5123 test_loss 0.4567 test_acc 0.8345
# samples/s 123456 lr ..."; a progress line: "... epoch 1/1 step 10/938 loss 1.2345 lr ... samples/s ...".
last_epoch_line() { grep -E 'epoch [0-9]+/[0-9]+ loss [0-9]' "$1" | tail -1 || true; }
field() { awk -v k="$2" '{ for (i = 1; i < NF; i++) if ($i == k) { print $(i + 1); exit } }' <<<"$1"; }
progress_losses() {  # "STEP LOSS" per progress line ("... step 7/324 (2%) loss 5.2214 ...")
  grep -oE 'step [0-9]+/[0-9]+ (\([0-9]+%\) )?loss [-0-9.eE+]+' "$1" | awk '{ split($2, s, "/"); print s[1], $NF }' ||
    true
}
absdiff_below() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < t) }'; }
first_error() {  # ": " and the first error line of a log, shortened, when there is one
  grep -m1 -E '\[(error|critical)\]|error:|Error' "$1" | sed -E 's/^(\[rank [0-9]+\] )?\[[0-9:.]+\] //' |
    cut -c1-160 | sed 's/^/: /; s/|/\//g' || true
}
catch2_summary() { grep -E 'All tests passed|test cases:|No tests ran' "$1" | tail -1 || true; }

# -- the steps ------------------------------------------------------------------------------------------

# passed_in_this_run STEP: true when STEP ran and passed in this run; else false with the note saying so. A step that
# reads another's output (a checkpoint) asks first: never an older run's output.
passed_in_this_run() {
  local k
  for k in "${!STEP_NAMES[@]}"; do
    [ "${STEP_NAMES[$k]}" = "$1" ] && [ "${STEP_RESULTS[$k]}" = PASS ] && return 0
  done
  NOTE="$1 did not pass in this run (run --only: name it too)"
  return 1
}

step_unit_gpu() {
  local logfile=$1 rc=0
  if [ ! -x "$B_BIN/unit_gpu" ]; then
    NOTE="unit_gpu is not in the bundle: the bundle was built without CUDA (cuda_build=$(info_get cuda_build))"
    return 1
  fi
  # 180 s: 27 s alone on the H200 at 9333afb; now beside the other GPU lanes, with the sweep cases added since.
  run_timed "$logfile" 180 "${UNIT_ENV[@]}" "$B_BIN/unit_gpu" || rc=$?
  case $rc in
    0) NOTE=$(catch2_summary "$logfile") ;;
    77)
      NOTE="exit 77: unit_gpu found NO usable GPU on a machine that must have one (driver? see nvidia-smi above)"
      log "!!!!!!!! unit_gpu: NO GPU FOUND (exit 77) !!!!!!!!"
      ;;
    124 | 137) ;;  # RUN_STATUS says it
    *) NOTE="exit $rc: $(catch2_summary "$logfile")" ;;
  esac
  return $((rc != 0))
}

# NCCL's watchdog on the GPU (unit_gpu's hidden "[nccl_watchdog]" case, in a process of its own: an abort that waits
# for the device, or a context it leaves broken, costs only that process): a collective that cannot finish is
# reported to on_fatal after dist.timeout_s, named, while its stream is still held.
step_nccl_watchdog() {
  local logfile=$1 rc=0
  [ -x "$B_BIN/unit_gpu" ] || { NOTE="unit_gpu is not in the bundle"; return 1; }
  run_timed "$logfile" 60 "${UNIT_ENV[@]}" "$B_BIN/unit_gpu" "[nccl_watchdog]" || rc=$?
  NOTE=$(grep -m1 -o "nccl_watchdog: on_fatal .*" "$logfile" | cut -c16-180 || true)
  [ -n "$NOTE" ] || NOTE=$(catch2_summary "$logfile")
  ((rc == 0)) || NOTE="exit $rc: $NOTE"
  return $((rc != 0))
}

# The fast path's own kernels and library calls (unit_gpu "[fastpath]", without the whole-model case) and the Llama
# family's kernels ("[llama]") under compute-sanitizer's memcheck: an out-of-bounds or misaligned access in a kernel
# that has never run shows here by name and address even where the numbers happen to pass. At most 150 s (12 s and
# 16 s on the H200 in 2026-11-27's windows; since then the sweep cases grew, and the other GPU lanes share the GPU);
# skipped where there is no compute-sanitizer.
step_sanitize_fastpath() {
  local logfile=$1 rc=0 cs
  cs=$(command -v compute-sanitizer 2>/dev/null || true)
  [ -n "$cs" ] || [ ! -x /usr/local/cuda/bin/compute-sanitizer ] || cs=/usr/local/cuda/bin/compute-sanitizer
  if [ -z "$cs" ]; then
    NOTE="skipped: no compute-sanitizer on this machine"
    return 0
  fi
  if [ ! -x "$B_BIN/unit_gpu" ]; then
    NOTE="unit_gpu is not in the bundle"
    return 1
  fi
  run_timed "$logfile" 150 "${UNIT_ENV[@]}" "$cs" --tool memcheck --error-exitcode 3 --print-limit 20 \
    "$B_BIN/unit_gpu" "[fastpath]~[model],[llama]" || rc=$?
  NOTE="$(grep -m1 -E 'ERROR SUMMARY' "$logfile" || true) $(catch2_summary "$logfile")"
  ((rc == 0)) || NOTE="exit $rc: $NOTE"
  return $((rc != 0))
}

step_unit() {
  local logfile=$1 exe=$2 rc=0
  run_timed "$logfile" 60 "${UNIT_ENV[@]}" "$B_BIN/$exe" || rc=$?
  NOTE=$(catch2_summary "$logfile")
  ((rc == 0)) || NOTE="exit $rc: $NOTE"
  return $((rc != 0))
}

# One training run of 1 epoch; sets NOTE from its epoch line. Progress on every step (for the comparison).
train_1rank() {
  local logfile=$1 device=$2 backend=$3 ckpt=$4 limit=$5 rc=0 line
  run_timed "$logfile" "$limit" "${DPT_ENV[@]}" "$B_BIN/dptrain" --config "$BUNDLE/configs/fmnist_mlp.toml" \
    "train.device=$device" "dist.backend=$backend" "data.dir=$BUNDLE/data" train.epochs=1 \
    train.progress_interval_s=0.001 "checkpoint.dir=$ckpt" --resume never || rc=$?
  line=$(last_epoch_line "$logfile")
  if ((rc != 0)); then
    NOTE="exit $rc$(first_error "$logfile")"
    return 1
  fi
  if [ -z "$line" ]; then
    NOTE="no epoch line in the output"
    return 1
  fi
  NOTE="loss $(field "$line" loss) test_acc $(field "$line" test_acc) samples/s $(field "$line" samples/s)"
}

step_train_gpu() { train_1rank "$1" cuda nccl "$WORK/nccl1" 120; }
step_train_cpu() { train_1rank "$1" cpu gloo "$WORK/cpu1" 150; }

# dptrain under the machine's own PyTorch 2.x torchrun (issue 34): the c10d client against torch 2.x's libuv and
# classic TCPStore servers (dpt-c10d-store-check, tests/support/python/c10d_server.py), then torchrun launching
# dptrain: one rank over NCCL on the GPU, and two sharing it over gloo, both through the agent's store. torchrun runs
# `env LD_LIBRARY_PATH=... dptrain` so that the bundle's libraries reach dptrain and not torchrun's Python.
step_torchrun() {
  local logfile=$1 rc=0 pf kind server v
  v=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null) || { NOTE="no PyTorch in python3"; return 1; }
  for kind in default classic; do
    pf=$WORK/c10d_port_$kind
    rm -f "$pf"
    python3 tests/support/python/c10d_server.py "$pf" $([ $kind = classic ] && echo classic) >>"$logfile" 2>&1 &
    server=$!
    for _ in $(seq 200); do [ -f "$pf" ] && break; sleep 0.1; done
    run_timed "$logfile" 30 "${DPT_ENV[@]}" "$B_BIN/dpt-c10d-store-check" 127.0.0.1 "$(cat "$pf" 2>/dev/null || echo 1)" v2 ||
      rc=$?
    wait $server || rc=1
    ((rc == 0)) || { NOTE="torch $v: the c10d client against its $kind server failed$(first_error "$logfile")"; return 1; }
  done
  local launch=(python3 -m torch.distributed.run --no_python env "LD_LIBRARY_PATH=$DPT_LD" "$B_BIN/dptrain"
                --config "$BUNDLE/configs/fmnist_mlp.toml" "data.dir=$BUNDLE/data" train.epochs=1 --resume never)
  run_timed "$logfile" 90 "${launch[@]:0:4}" --nproc_per_node 1 "${launch[@]:4}" train.device=cuda dist.backend=nccl \
    "checkpoint.dir=$WORK/torchrun_nccl" || rc=$?
  ((rc == 0)) || { NOTE="torch $v torchrun, 1 rank nccl: exit $rc$(first_error "$logfile")"; return 1; }
  run_timed "$logfile" 120 "${launch[@]:0:4}" --nproc_per_node 2 "${launch[@]:4}" train.device=cuda dist.backend=gloo \
    "checkpoint.dir=$WORK/torchrun_gloo" || rc=$?
  ((rc == 0)) || { NOTE="torch $v torchrun, 2 ranks gloo: exit $rc$(first_error "$logfile")"; return 1; }
  grep -q "torchrun's agent store" "$logfile" || { NOTE="torch $v: dptrain did not join the agent's store"; return 1; }
  NOTE="torch $v: the c10d client against its libuv and classic servers; torchrun launched dptrain (1 rank nccl, 2 gloo)"
}

# GPU against CPU: the epoch's mean loss and the test accuracy within the tolerances, and the loss at the
# first step both runs printed (nearly equal: differences grow with the steps, from summation order).
step_compare() {
  local logfile=$1 g c gl cl ga ca ok=0 step sl_g sl_c
  g=$(last_epoch_line "$STEP_DIR/train_cuda_nccl_1rank.log")
  c=$(last_epoch_line "$STEP_DIR/train_cpu_1rank.log")
  if [ -z "$g" ] || [ -z "$c" ]; then
    NOTE="needs the epoch lines of both runs (train_cuda_nccl_1rank, train_cpu_1rank)"
    return 1
  fi
  gl=$(field "$g" loss) cl=$(field "$c" loss) ga=$(field "$g" test_acc) ca=$(field "$c" test_acc)
  {
    echo "epoch line, GPU: $g"
    echo "epoch line, CPU: $c"
  } >>"$logfile"
  local first
  first=$(join <(progress_losses "$STEP_DIR/train_cuda_nccl_1rank.log" | sort -k1,1) \
    <(progress_losses "$STEP_DIR/train_cpu_1rank.log" | sort -k1,1) | sort -n | head -1)
  if [ -n "$first" ]; then
    read -r step sl_g sl_c <<<"$first"
    echo "first common progress step $step: loss GPU $sl_g CPU $sl_c" >>"$logfile"
    absdiff_below "$sl_g" "$sl_c" "$LOSS_TOL" || ok=1
    NOTE="step $step loss $sl_g/$sl_c; "
  else
    echo "no progress step printed by both runs: comparing the epoch lines only" >>"$logfile"
  fi
  absdiff_below "$gl" "$cl" "$LOSS_TOL" || ok=1
  absdiff_below "$ga" "$ca" "$ACC_TOL" || ok=1
  NOTE+="epoch loss $gl/$cl, test_acc $ga/$ca (GPU/CPU; tolerances $LOSS_TOL, $ACC_TOL)"
  echo "$NOTE" >>"$logfile"
  return "$ok"
}

# run_learns LOGFILE LIMIT_S MIN_ACC COMMAND...: one training run that must exit 0 with a final test_acc above
# MIN_ACC; sets NOTE.
run_learns() {
  local logfile=$1 limit=$2 min=$3 rc=0 line acc
  shift 3
  run_timed "$logfile" "$limit" "$@" || rc=$?
  line=$(last_epoch_line "$logfile")
  acc=$(field "$line" test_acc)
  NOTE="exit $rc, test_acc ${acc:-none} (must be > $min)"
  ((rc == 0)) || NOTE+=$(first_error "$logfile")
  ((rc == 0)) && [ -n "$acc" ] && awk -v a="$acc" -v m="$min" 'BEGIN { exit !(a > m) }'
}

# Two ranks sharing the GPU over gloo; extra arguments are config overrides (dist.grad_dtype=bf16: the
# bfloat16 all-reduce with device tensors staged through the host; dist.zero=1: ZeRO stage 1, the reduce-scatter,
# the optimizer over the rank's pieces, the all-gather and the sharded checkpoint of device tensors). Stages 2 and 3
# (the gradient and parameter buckets released and reserved around their use, the gathers prefetched on the
# strategy's communication thread) are the equiv_cuda_gloo_2rank_zero* steps, compared with DDP.
step_train_gloo2() {
  local logfile=$1
  shift
  run_learns "$logfile" 150 0.8 "${DPT_ENV[@]}" "$B_BIN/dprun" --nproc-per-node 2 -- \
    "$B_BIN/dptrain" --config "$BUNDLE/configs/fmnist_mlp.toml" train.device=cuda dist.backend=gloo \
    "data.dir=$BUNDLE/data" train.epochs=1 "checkpoint.dir=$WORK/gloo2_$(echo "$*" | tr -c 'a-z0-9' _)" \
    --resume never "$@"
}

# Two ranks sharing the GPU over mpi: the bundle's mpirun (Open MPI's runtime as stage_openmpi bundled it, found
# through OMPI_ENV) starting dptrain twice; extra arguments are config overrides, as step_train_gloo2's. Open MPI
# passes mpirun's environment (the bundle's libraries among it) on to the ranks.
step_train_mpi2() {
  local logfile=$1
  shift
  [ -x "$B_BIN/mpirun" ] || { NOTE="no mpirun in the bundle (bundled before it carried Open MPI)"; return 1; }
  run_learns "$logfile" 150 0.8 "${MPIRUN2[@]}" "$B_BIN/dptrain" --config "$BUNDLE/configs/fmnist_mlp.toml" \
    train.device=cuda dist.backend=mpi \
    "data.dir=$BUNDLE/data" train.epochs=1 "checkpoint.dir=$WORK/mpi2_$(echo "$*" | tr -c 'a-z0-9' _)" \
    --resume never "$@"
}

# Two ranks sharing the GPU train like one rank with the doubled batch, and ZeRO like DDP (issue 30): EQUIV_STEPS
# steps of the MLP from the same seed, clipped to a gradient norm of 1 (it clips: on the CPU that moves the weights
# by 7.5e-3 in 20 steps), batch 64 a rank on two ranks (gloo under dprun, mpi under the bundle's mpirun) against
# batch 128 on one rank over NCCL, and ZeRO stages 1-3 on two ranks over gloo against DDP on the same two;
# the last checkpoints compared by tests/support/python/ckpt.py (the largest |a - b| of any tensor, as the CPU's
# integration tests compare 1 x 2B with 2 x B, and ZeRO with DDP; equiv_compare says which tensors). Each
# comparison reads the checkpoint of a step before it in this run.
EQUIV_STEPS=20
# Rounding alone moves these runs apart by more than the last bits: on the CPU, one rank at batch 128 with one BLAS
# thread against the same with two (nothing else changed) parts by 2.4e-5 at step 4 and by 1.65e-4 in the parameters
# and 1.6e-3 in the momentum at step 20 (a jump at one step: a ReLU input on the other side of 0, most likely), as do
# 2 x 64 and 1 x 128; half the batch left out moves them 1.5e-2 and 0.46. Hence 1e-3 for the parameters, 1e-2 for the
# momentum: six times the rounding's worst seen, a tenth of the smallest real error checked.
EQUIV_TOL=${GPU_CHECK_EQUIV_TOL:-1e-3}
EQUIV_MOMENTUM_TOL=${GPU_CHECK_EQUIV_MOMENTUM_TOL:-1e-2}
# ZeRO against DDP on the same ranks: the same sums (of two floats: no order) and an elementwise update, so the CPU's
# integration.train_zero finds them bitwise equal; the tolerance leaves the last bit to the GPU's optimizer kernel
# run over shards.
EQUIV_ZERO_TOL=${GPU_CHECK_EQUIV_ZERO_TOL:-1e-6}
equiv_ckpt() { echo "$WORK/equiv_$1/step-$(printf %08d $EQUIV_STEPS)"; }
equiv_run() {  # LOGFILE NAME LAUNCHER... :: ARGS...: a run of EQUIV_STEPS steps into $WORK/equiv_NAME
  local logfile=$1 name=$2 rc=0 launcher=()
  shift 2
  while [ "$1" != :: ]; do launcher+=("$1"); shift; done
  shift
  rm -rf "$WORK/equiv_$name"
  run_timed "$logfile" 120 "${launcher[@]}" "$B_BIN/dptrain" --config "$BUNDLE/configs/fmnist_mlp.toml" \
    "data.dir=$BUNDLE/data" train.device=cuda train.max_steps=$EQUIV_STEPS train.progress_interval_s=1000 \
    train.clip_grad_norm=1.0 "checkpoint.dir=$WORK/equiv_$name" --resume never "$@" || rc=$?
  ((rc == 0)) || { NOTE="exit $rc$(first_error "$logfile")"; return 1; }
  [ -d "$(equiv_ckpt "$name")" ] || { NOTE="no checkpoint at step $EQUIV_STEPS"; return 1; }
}
# NAME's checkpoint against REFERENCE's: the parameters (model.safetensors), and the optimizer state (momentum) where
# both wrote it whole (optimizer.safetensors; ZeRO writes it in shards a rank, which are not compared); sets NOTE.
equiv_compare() {  # LOGFILE REFERENCE NAME TOL WHAT [MOMENTUM_TOL (default TOL)]
  local logfile=$1 ref=$2 name=$3 tol=$4 what=$5 mtol=${6:-$4} out rc d dm opt="" a b
  a=$(equiv_ckpt "$ref") b=$(equiv_ckpt "$name")
  out=$("${PYTHON:-python3}" tests/support/python/ckpt.py compare "$a" "$b" "$tol" 2>&1) && rc=0 || rc=$?
  if ((rc == 0)) && [ -f "$a/optimizer.safetensors" ] && [ -f "$b/optimizer.safetensors" ]; then
    out+=$'\n'$("${PYTHON:-python3}" tests/support/python/ckpt.py compare_file "$a/optimizer.safetensors" \
      "$b/optimizer.safetensors" "$mtol" 2>&1) && rc=0 || rc=$?
    opt=" and momentum"
  fi
  echo "$out" >>"$logfile"
  # The comparisons' largest differences, the parameters' then the momentum's (no '|' in a note: it ends up in
  # Markdown tables).
  d=$(sed -n 's/^max |a-b| = \([^ ]*\) .*/\1/p' <<<"$out" | head -1)
  dm=$(sed -n 's/^max |a-b| = \([^ ]*\) .*/\1/p' <<<"$out" | sed -n 2p)
  NOTE="$what after $EQUIV_STEPS steps: "
  if ((rc == 0)) && [ -n "$d" ]; then
    NOTE+="parameters within $d of each other (tolerance $tol)"
    [ -z "$opt" ] || NOTE+=", momentum within $dm (tolerance $mtol)"
  else NOTE+=$(tail -1 <<<"$out" | tr '|' /); fi
  return $((rc != 0))
}
step_equiv_1rank() {
  equiv_run "$1" 1x128 "${DPT_ENV[@]}" :: dist.backend=nccl train.batch_size=128 || return 1
  NOTE="1 rank, batch 128, nccl: $EQUIV_STEPS steps"
}
step_equiv_2rank() {  # LOGFILE gloo|mpi
  local logfile=$1 backend=$2 launcher
  passed_in_this_run equiv_cuda_1rank_b128 || return 1
  if [ "$backend" = mpi ]; then
    [ -x "$B_BIN/mpirun" ] || { NOTE="no mpirun in the bundle"; return 1; }
    launcher=("${MPIRUN2[@]}")
  else
    launcher=("${DPT_ENV[@]}" "$B_BIN/dprun" --nproc-per-node 2 --)
  fi
  equiv_run "$logfile" "2x64_$backend" "${launcher[@]}" :: "dist.backend=$backend" train.batch_size=64 || return 1
  equiv_compare "$logfile" 1x128 "2x64_$backend" "$EQUIV_TOL" "2 ranks x batch 64 ($backend) against 1 x 128 (nccl)" \
    "$EQUIV_MOMENTUM_TOL"
}
step_equiv_zero() {  # LOGFILE STAGE: stage 3 with 1 MB buckets (the MLP's 2.6 MB in three)
  local logfile=$1 stage=$2 extra=()
  passed_in_this_run equiv_cuda_gloo_2rank || return 1
  ((stage == 3)) && extra=(dist.bucket_cap_mb=1)
  equiv_run "$logfile" "2x64_gloo_zero$stage" "${DPT_ENV[@]}" "$B_BIN/dprun" --nproc-per-node 2 -- :: \
    dist.backend=gloo train.batch_size=64 "dist.zero=$stage" "${extra[@]}" || return 1
  equiv_compare "$logfile" 2x64_gloo "2x64_gloo_zero$stage" "$EQUIV_ZERO_TOL" \
    "ZeRO stage $stage against DDP (2 ranks x batch 64, gloo)"
}

# The memory report on a GPU (issue 11): one rank over NCCL with log.memory = true. The report gives the MLP's
# 669706 parameters as 2.55 MiB three times (parameters, gradients, momentum), every epoch line the device's
# used memory, and the metrics file's memory record the driver's figures.
step_memory_gpu() {
  local logfile=$1 rc=0 dir=$WORK/memory
  run_timed "$logfile" 120 "${DPT_ENV[@]}" "$B_BIN/dptrain" --config "$BUNDLE/configs/fmnist_mlp.toml" \
    train.device=cuda dist.backend=nccl "data.dir=$BUNDLE/data" train.epochs=1 log.memory=true \
    train.progress_interval_s=0.5 "checkpoint.dir=$dir/checkpoints" --resume never || rc=$?
  if ((rc != 0)); then
    NOTE="exit $rc$(first_error "$logfile")"
    return 1
  fi
  local report epoch_mem
  report=$(grep -m1 -oE 'memory per rank: parameters 2.55 MiB, gradients 2.55 MiB, optimizer state 2.55 MiB, activations [0-9.]+ [KMG]iB' "$logfile" || true)
  epoch_mem=$(grep -m1 -oE 'epoch 1/1 memory: .*device [0-9.]+ [KMG]iB of [0-9.]+ [KMG]iB used' "$logfile" || true)
  if [ -z "$report" ] || [ -z "$epoch_mem" ] ||
    ! grep '"kind":"memory"' "$dir/metrics.jsonl" | grep -q '"device_used_bytes":[1-9]'; then  # keys sorted: no order
    NOTE="memory report missing or wrong: '${report:-none}' / '${epoch_mem:-none}' / metrics.jsonl's memory record: $(grep -c '"kind":"memory"' "$dir/metrics.jsonl" 2>/dev/null || true), with device_used_bytes: $(grep '"kind":"memory"' "$dir/metrics.jsonl" 2>/dev/null | grep -c device_used_bytes || true)"
    return 1
  fi
  NOTE="${report#memory per rank: }; ${epoch_mem#epoch 1/1 memory: }"
}

# The memory report against PyTorch (issue 30): dptrain's peak tensor memory (the metrics file's memory record,
# tensor_peak_bytes, after the first step) within MEMORY_TOL of torch.cuda.max_memory_allocated less cuBLAS's
# workspaces (which PyTorch's allocator holds and dptrain does not count among its tensors) for the same MLP, batch and
# SGD with momentum (scripts/bench/torch_memory.py, the machine's PyTorch). The MLP is big (784-8192-8192-10, 73.6M
# parameters: 295 MB each of parameters, gradients and momentum) so that workspaces, activations and the allocator's
# rounding are small beside it. The parameter bytes must agree exactly (else the two models differ).
MEMORY_HIDDEN=8192,8192
MEMORY_BATCH=64
MEMORY_TOL=0.10
step_memory_vs_torch() {
  local logfile=$1 rc=0 dir=$WORK/memory_vs_torch py=${PYTHON:-python3}
  rm -rf "$dir"
  run_timed "$logfile" 90 "${DPT_ENV[@]}" "$B_BIN/dptrain" --config "$BUNDLE/configs/fmnist_mlp.toml" \
    train.device=cuda dist.backend=nccl "data.dir=$BUNDLE/data" "model.hidden=[$MEMORY_HIDDEN]" \
    "train.batch_size=$MEMORY_BATCH" train.max_steps=3 data.test_limit=1000 log.memory=true \
    "checkpoint.dir=$dir/checkpoints" --resume never || rc=$?
  ((rc == 0)) || { NOTE="dptrain: exit $rc$(first_error "$logfile")"; return 1; }
  # Its JSON line (stdout) into its own file; its messages (stderr) into the step's log.
  # shellcheck disable=SC2016  # $1 and $@ are the inner shell's
  run_timed "$logfile" 90 bash -c 'out=$1; shift; exec "$@" >"$out"' _ "$dir/torch.json" "$py" \
    scripts/bench/torch_memory.py --device cuda --hidden "$MEMORY_HIDDEN" --batch-size "$MEMORY_BATCH" --steps 3 ||
    rc=$?
  cat "$dir/torch.json" >>"$logfile" 2>/dev/null || true
  ((rc == 0)) || { NOTE="torch_memory.py ($py): exit $rc$(first_error "$logfile")"; return 1; }
  NOTE=$(memory_compare "$dir/metrics.jsonl" "$dir/torch.json" "$MEMORY_TOL" 2>>"$logfile") || rc=1
  echo "$NOTE" >>"$logfile"
  [ -n "$NOTE" ] || NOTE="the comparison printed nothing (see the log)"
  return "$rc"
}

# memory_compare METRICS.jsonl TORCH.json TOL: one line giving dptrain's peak tensors, torch's max_memory_allocated
# less its workspace, and their ratio; exit 1 when the ratio is off 1 by more than TOL or the parameter bytes differ.
memory_compare() {
  python3 - "$@" <<'PY'
import json, sys
with open(sys.argv[1]) as f:
    mem = [r for r in map(json.loads, f) if r.get("kind") == "memory"]
with open(sys.argv[2]) as f:
    t = json.loads(f.read().strip().splitlines()[-1])
tol = float(sys.argv[3])
if not mem:
    print("no memory record in dptrain's metrics file")
    sys.exit(1)
m = mem[0]
mib = lambda b: f"{b / 2**20:.1f} MiB"
ours, ws = m["tensor_peak_bytes"], t["workspace_bytes"]
ref = t["max_memory_allocated"] - ws
ratio = ours / ref if ref > 0 else float("inf")
close, same = abs(ratio - 1) <= tol, m["param_bytes"] == t["param_bytes"]
print(f"dptrain peak tensors {mib(ours)} ({ours} B), torch max_memory_allocated {mib(t['max_memory_allocated'])} "
      f"- workspace {mib(ws)} = {mib(ref)}: ratio {ratio:.3f} (within {tol:g}: {'yes' if close else 'NO'}); "
      f"parameters {m['param_bytes']} B / {t['param_bytes']} B{'' if same else ' DIFFER (not the same model)'}; "
      f"torch {t.get('torch', '?')}")
sys.exit(0 if close and same else 1)
PY
}

# An out-of-memory on the GPU: an MLP of 68.9G parameters (275 GB of them alone) cannot be allocated; dptrain must
# exit 1 with the message naming the device, the size and the phase.
step_oom_gpu() {
  local logfile=$1 rc=0 line
  run_timed "$logfile" 60 "${DPT_ENV[@]}" "$B_BIN/dptrain" --config "$BUNDLE/configs/fmnist_mlp.toml" \
    train.device=cuda dist.backend=nccl "data.dir=$BUNDLE/data" train.epochs=1 'model.hidden=[262144,262144]' \
    "checkpoint.dir=$WORK/oom/checkpoints" --resume never || rc=$?
  line=$(grep -m1 -oE 'out of memory on cuda:0: cannot allocate [^)]*\) while [a-z ]+' "$logfile" || true)
  if ((rc != 1)) || [ -z "$line" ]; then
    NOTE="expected exit 1 and 'out of memory on cuda:0 ... while ...'; got exit $rc$(first_error "$logfile")"
    return 1
  fi
  NOTE=$line
}

# The small ResNet of configs/fmnist_resnet.toml on the GPU (cuDNN convolutions, BatchNorm, pooling kernels),
# one epoch on one rank over NCCL, in a given train.precision (bf16/fp16: the tensor-core path).
# In fp16 the epoch's loss-scaling line must be there, its scale a finite positive number (issue 30: "loss scale
# finite, skipped steps reported"); the note gives it.
step_train_resnet() {
  local logfile=$1 precision=$2 scaling scale
  run_learns "$logfile" 240 0.6 "${DPT_ENV[@]}" "$B_BIN/dptrain" --config "$BUNDLE/configs/fmnist_resnet.toml" \
    train.device=cuda dist.backend=nccl "data.dir=$BUNDLE/data" train.epochs=1 "train.precision=$precision" \
    "checkpoint.dir=$WORK/resnet_$precision" --resume never || return 1
  [ "$precision" = fp16 ] || return 0
  scaling=$(grep -oE 'fp16 loss scale [^;]+; [0-9]+ step\(s\) skipped' "$logfile" | tail -1 || true)
  scale=$(awk '{ sub(/;$/, "", $4); print $4 }' <<<"$scaling")
  NOTE+="; ${scaling:-no loss-scaling line}"
  [ -n "$scaling" ] && awk -v s="$scale" 'BEGIN { exit !(s + 0 > 0 && s + 0 < 1e38 && s == s + 0) }'
}

# dptrain predict with the ResNet that train_cuda_resnet_fp32 trained, on the GPU and on the CPU, over 500
# Fashion-MNIST validation images (dptrain export-images): the same top-1 class for every image, or, where they
# differ, a near tie on the CPU (its two best probabilities within PREDICT_TIE); the largest difference of the top-1
# probability is in the note.
PREDICT_TIE=1e-3
step_predict_gpu_cpu() {
  local logfile=$1 ckpt=$WORK/resnet_fp32 images=$WORK/predict_images dev rc=0
  passed_in_this_run train_cuda_resnet_fp32 || return 1
  rm -rf "$images"
  run_timed "$logfile" 60 "${DPT_ENV[@]}" "$B_BIN/dptrain" export-images --data-dir "$BUNDLE/data" --out "$images" \
    --limit 500 || { NOTE="export-images: exit $?$(first_error "$logfile")"; return 1; }
  for dev in cuda cpu; do
    run_timed "$logfile" 90 "${DPT_ENV[@]}" "$B_BIN/dptrain" predict --checkpoint "$ckpt" --input "$images/val" \
      --out "$WORK/predict_$dev.jsonl" --top-k 2 "train.device=$dev" dist.backend=auto || rc=$?
    ((rc == 0)) || { NOTE="predict on $dev: exit $rc$(first_error "$logfile")"; return 1; }
  done
  NOTE=$(predict_compare "$WORK/predict_cuda.jsonl" "$WORK/predict_cpu.jsonl" "$PREDICT_TIE" 2>>"$logfile") || rc=1
  echo "$NOTE" >>"$logfile"
  [ -n "$NOTE" ] || NOTE="the comparison printed nothing (see the log)"
  return "$rc"
}

# predict_compare GPU.jsonl CPU.jsonl TIE: one line saying how the two predictions agree; exit 1 when an image's
# top-1 differs without a near tie on the CPU side, or the files list other images.
predict_compare() {
  python3 - "$@" <<'PY'
import json, sys
def load(path):
    with open(path) as f:
        return {r["path"]: r for r in map(json.loads, f) if r.get("path")}
gpu, cpu, tie = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
if not cpu or sorted(gpu) != sorted(cpu):
    print(f"the files list other images: {len(gpu)} on the GPU, {len(cpu)} on the CPU")
    sys.exit(1)
same, ties, bad, worst = 0, [], [], 0.0
for path, c in cpu.items():
    g = gpu[path]
    if "error" in c or "error" in g:
        bad.append(f"{path}: {c.get('error') or g.get('error')}")
        continue
    gt, ct = g["top"], c["top"]
    if gt[0]["index"] == ct[0]["index"]:
        same += 1
        worst = max(worst, abs(gt[0]["prob"] - ct[0]["prob"]))
    elif len(ct) > 1 and ct[0]["prob"] - ct[1]["prob"] <= tie:
        ties.append(path)
    else:
        bad.append(f"{path}: GPU {gt[0]['class']} {gt[0]['prob']}, CPU {ct[0]['class']} {ct[0]['prob']}")
print(f"{same} of {len(cpu)} images: the same top-1 (top-1 probability within {worst:.2g}); "
      f"{len(ties)} near tie(s) on the CPU (within {tie:g}) part; {len(bad)} differ"
      + (f": {'; '.join(bad[:3])}" if bad else ""))
sys.exit(1 if bad else 0)
PY
}

step_bench() {
  local logfile=$1 rc=0 left per_run
  left=$((DEADLINE - $(date +%s) - 20))
  per_run=$((left / 4))
  ((per_run <= 120)) || per_run=120
  run_timed "$logfile" 300 env OUT="${OUT:-}" DPTRAIN="$B_BIN/dptrain" DPT_LIB_PATH="$DPT_LD" \
    BENCH_DATA="$BUNDLE/data" BENCH_CONFIG="$BUNDLE/configs/fmnist_mlp.toml" BENCH_LOG_DIR="$STEP_DIR/bench" \
    BENCH_RUN_TIMEOUT_S="$per_run" BENCH_RESULTS="$STEP_DIR/results-mlp.jsonl" bash scripts/bench/gpu_bench.sh || rc=$?
  grep -E '^\||^targets|^ *(batch|ratio) ' "$logfile" | tee -a "$MAIN_LOG" || true
  NOTE=$(grep -E '^targets' "$logfile" | tail -1 || true)
  ((rc == 0)) || NOTE="exit $rc ${NOTE}"
  return $((rc != 0))
}

# How many examples a second this machine's CPU fills from Fashion-MNIST through dptrain's Loader (one worker, as the
# bench step's dptrain; batch 1024), with and without Dataset::prefetch: what the MLP's row at batch 1024 can reach
# when its loader sets the pace. A few seconds, before the benchmarks' timings, with nothing else running.
step_loader_bench() {
  local logfile=$1 rc=0
  run_timed "$logfile" 60 "${DPT_ENV[@]}" "$B_BIN/dpt-loader-bench" --data "$BUNDLE/data" --batch 1024 --workers 1 \
    --epochs 3 || rc=$?
  NOTE=$(awk '/^\| prefetch/ { w = $(NF - 1) } /^\| no prefetch/ { n = $(NF - 1) } /^prefetch \/ no prefetch/ { r = $NF }
    END { if (w != "") printf "examples/s, 1 worker, batch 1024: %s with prefetch, %s without (%sx)", w, n, r }' "$logfile")
  ((rc == 0)) || NOTE="exit $rc$(first_error "$logfile")"
  return $((rc != 0))
}

# The ResNet rows of issue 8 (scripts/bench/resnet_bench.sh --gpu): dpt-model-bench against torch_resnet.py,
# 6 runs, each capped at a sixth of what is left of the budget (at most 120 s), none past BENCH_DEADLINE: 25 s before
# run_timed would stop the script (a run's kill may take 10 s), so that it writes its report and the rows it measured
# when the budget runs short.
step_bench_resnet() {
  local logfile=$1 rc=0 left per_run
  left=$((DEADLINE - $(date +%s) - 20))
  per_run=$((left / 6))
  ((per_run <= 120)) || per_run=120
  ((per_run >= 30)) || per_run=30  # PyTorch's start alone takes ~10 s: a shorter limit fails every PyTorch row
  run_timed "$logfile" 600 env OUT="${OUT:-}" MODEL_BENCH="$B_BIN/dpt-model-bench" DPT_LIB_PATH="$DPT_LD" \
    BENCH_LOG_DIR="$STEP_DIR/bench_resnet" BENCH_RUN_TIMEOUT_S="$per_run" BENCH_RESULTS="$STEP_DIR/results-resnet.jsonl" \
    BENCH_DEADLINE=$((DEADLINE - 35)) bash scripts/bench/resnet_bench.sh --gpu ||
    rc=$?
  grep -E '^\||^targets' "$logfile" | tee -a "$MAIN_LOG" || true
  NOTE=$(grep -E '^targets' "$logfile" | tail -1 || true)
  ((rc == 0)) || NOTE="exit $rc ${NOTE}"
  return $((rc != 0))
}

# The small GPT of configs/gpt_tiny.toml (4 layers, 128 wide, byte-level vocabulary, T 64, batch 16, AdamW,
# fp32) on the bundle's token shards, GPT_STEPS optimizer steps on one rank with a progress line every step,
# then the evaluation on 256 validation windows: on the GPU over NCCL, and the same on the CPU (gloo). Further
# arguments are config overrides (the transformer fast path: train.precision=bf16 train.bf16_activations=true).
# train_lm runs another language model's config the same way (configs/llama_tiny.toml: the Llama family).
GPT_STEPS=50
train_gpt() { train_lm gpt_tiny "$@"; }
train_lm() {
  local config=$1 logfile=$2 device=$3 backend=$4 limit=$5 rc=0 line
  shift 5
  if [ ! -d "$BUNDLE/tokens" ]; then
    NOTE="no $BUNDLE/tokens (bundle makes it with dptrain tokenize from Debian's fortunes: were they installed?)"
    return 1
  fi
  run_timed "$logfile" "$limit" "${DPT_ENV[@]}" "$B_BIN/dptrain" --config "$BUNDLE/configs/$config.toml" \
    "train.device=$device" "dist.backend=$backend" "data.dir=$BUNDLE/tokens" "train.max_steps=$GPT_STEPS" \
    data.test_limit=256 train.progress_interval_s=0.001 "checkpoint.dir=$WORK/$(basename "$logfile" .log)" \
    --resume never "$@" || rc=$?
  line=$(last_epoch_line "$logfile")
  if ((rc != 0)); then
    NOTE="exit $rc$(first_error "$logfile")"
    return 1
  fi
  if [ -z "$line" ]; then
    NOTE="no epoch line in the output"
    return 1
  fi
  NOTE="loss $(field "$line" loss) test_loss $(field "$line" test_loss) test_acc $(field "$line" test_acc) tokens/s $(field "$line" tokens/s)"
}

step_train_gpt_gpu() { train_gpt "$1" cuda nccl 120 "${@:2}"; }
step_train_gpt_cpu() { train_gpt "$1" cpu gloo 120 "${@:2}"; }
step_train_llama_gpu() { train_lm llama_tiny "$1" cuda nccl 120 "${@:2}"; }
# train.autotune inside dptrain (issue 33; its tuning ran before only in dpt-model-bench --lt-tune): the fast path's
# GPT with its cuBLASLt plans and cuDNN attention graphs timed after the first step, its weight gradients allowed
# torch.autocast's bf16 products where faster (train.autotune_bf16_grads). PASS when it trains and its log has the
# tuning's summary line; compare_gpt_autotune_gpu_cpu then holds its losses to the CPU fast path's (the tuned
# algorithms round alike, and a bf16 weight gradient is one more rounding: the bf16 comparison's tolerances).
step_train_gpt_autotune() {
  local logfile=$1 summary
  train_gpt "$logfile" cuda nccl 120 train.precision=bf16 train.bf16_activations=true train.autotune=true \
    train.autotune_bf16_grads=true || return 1
  summary=$(grep -m1 -o 'train.autotune: [0-9]* of [0-9]* plan(s) timed.*' "$logfile" || true)
  if [ -z "$summary" ]; then
    NOTE="no 'train.autotune: ... plan(s) timed' line in the log; $NOTE"
    return 1
  fi
  if ! grep -q '^train.autotune: [1-9][0-9]* of' <<<"$summary"; then  # every plan's sweep failed: a warning each
    NOTE="train.autotune timed no plan: ${summary:0:160}"
    return 1
  fi
  NOTE="$NOTE; ${summary:0:160}"
}
step_train_llama_cpu() { train_lm llama_tiny "$1" cpu gloo 120 "${@:2}"; }

# train.cuda_graph inside dptrain (issue 33; ran on the H200 on 2026-11-29): the fast path's GPT with each step's
# zero_grad, forward, loss, backward, gradient clipping and AdamW one CUDA graph (the lr and step staged before each
# launch), otherwise train_cuda_gpt_bf16act's run. PASS when it trains and its log says steps were launched from a
# graph with the update inside; compare_gpt_graph_eager then holds it to that run bit for bit.
step_train_gpt_graph() {
  local logfile=$1 summary
  train_gpt "$logfile" cuda nccl 120 train.precision=bf16 train.bf16_activations=true train.cuda_graph=true || return 1
  summary=$(grep -m1 -o 'train.cuda_graph: [0-9]* step(s) launched.*' "$logfile" || true)
  if ! grep -q '^train.cuda_graph: [1-9]' <<<"$summary"; then
    NOTE="no step launched from a CUDA graph (${summary:-no 'train.cuda_graph:' line}); $NOTE"
    return 1
  fi
  if ! grep -q 'the clipping and AdamW inside' <<<"$summary"; then
    NOTE="the optimizer's update ran outside the graph: ${summary:0:160}"
    return 1
  fi
  NOTE="$NOTE; ${summary:0:160}"
}

# The graph run against the eager one (train_cuda_gpt_graph, train_cuda_gpt_bf16act: the same config but
# train.cuda_graph): the loss of every step both printed the same text, and their newest checkpoints'
# model.safetensors and optimizer.safetensors the same bytes (the parameters and AdamW's state, bit for bit).
step_compare_gpt_graph_eager() {
  local logfile=$1 g=train_cuda_gpt_graph e=train_cuda_gpt_bf16act common differ gc ec f
  passed_in_this_run "$g" && passed_in_this_run "$e" || return 1
  # The steps both printed (a progress line is due by time: a faster step may skip one): "STEP LOSS_G LOSS_E".
  common=$(join <(progress_losses "$STEP_DIR/$g.log" | sort -k1,1) <(progress_losses "$STEP_DIR/$e.log" | sort -k1,1) |
    sort -n)
  echo "$common" >>"$logfile"
  differ=$(awk '$2 != $3' <<<"$common")
  if [ -z "$common" ]; then
    NOTE="no progress step printed by both runs (progress_losses found none in $g.log or $e.log)"
    return 1
  fi
  if [ -n "$differ" ]; then
    NOTE="progress losses: $(wc -l <<<"$differ") of $(wc -l <<<"$common") common steps differ (step, graph, eager):"
    NOTE+=" $(head -1 <<<"$differ")"
    return 1
  fi
  gc=$(find "$WORK/$g" -maxdepth 1 -name 'step-*' -type d | sort | tail -1)
  ec=$(find "$WORK/$e" -maxdepth 1 -name 'step-*' -type d | sort | tail -1)
  if [ -z "$gc" ] || [ "$(basename "$gc")" != "$(basename "${ec:-none}")" ]; then
    NOTE="newest checkpoints: '${gc}' and '${ec}'"
    return 1
  fi
  for f in model.safetensors optimizer.safetensors; do
    if ! cmp "$gc/$f" "$ec/$f" >>"$logfile" 2>&1; then
      NOTE="$(basename "$gc")/$f differs between the graph run and the eager one"
      return 1
    fi
  done
  NOTE="$(wc -l <<<"$common") steps' progress losses and $(basename "$gc")'s parameters and AdamW state: the same bits"
}

# GPU against CPU for the GPT: the loss at the first and the last step both runs printed, the running training
# loss of the epoch line and the validation loss within GPU_CHECK_LOSS_TOL, the next-byte accuracy within
# GPU_CHECK_ACC_TOL. Arguments: the two steps compared (default train_cuda_gpt, train_cpu_gpt) and a factor on
# both tolerances (default 1; the fast path's bf16 activations round at other points on the two sides: 5).
step_compare_gpt() {
  local logfile=$1 gname=${2:-train_cuda_gpt} cname=${3:-train_cpu_gpt} factor=${4:-1}
  local g c ok=0 common first last line step sl_g sl_c k l_tol a_tol
  l_tol=$(awk -v t="$LOSS_TOL" -v f="$factor" 'BEGIN { print t * f }')
  a_tol=$(awk -v t="$ACC_TOL" -v f="$factor" 'BEGIN { print t * f }')
  local LOSS_TOL=$l_tol ACC_TOL=$a_tol  # this comparison's, scaled
  g=$(last_epoch_line "$STEP_DIR/$gname.log")
  c=$(last_epoch_line "$STEP_DIR/$cname.log")
  if [ -z "$g" ] || [ -z "$c" ]; then
    NOTE="needs the epoch lines of both runs ($gname, $cname)"
    return 1
  fi
  {
    echo "epoch line, GPU: $g"
    echo "epoch line, CPU: $c"
  } >>"$logfile"
  common=$(join <(progress_losses "$STEP_DIR/$gname.log" | sort -k1,1) \
    <(progress_losses "$STEP_DIR/$cname.log" | sort -k1,1) | sort -n)
  NOTE=""
  if [ -n "$common" ]; then
    first=$(head -1 <<<"$common") last=$(tail -1 <<<"$common")
    for line in "$first" "$last"; do
      read -r step sl_g sl_c <<<"$line"
      echo "progress step $step: loss GPU $sl_g CPU $sl_c" >>"$logfile"
      absdiff_below "$sl_g" "$sl_c" "$LOSS_TOL" || ok=1
      NOTE+="step $step loss $sl_g/$sl_c; "
    done
  else
    echo "no progress step printed by both runs: comparing the epoch lines only" >>"$logfile"
  fi
  for k in loss test_loss; do
    absdiff_below "$(field "$g" "$k")" "$(field "$c" "$k")" "$LOSS_TOL" || ok=1
  done
  absdiff_below "$(field "$g" test_acc)" "$(field "$c" test_acc)" "$ACC_TOL" || ok=1
  NOTE+="epoch loss $(field "$g" loss)/$(field "$c" loss), test_loss $(field "$g" test_loss)/$(field "$c" test_loss), "
  NOTE+="test_acc $(field "$g" test_acc)/$(field "$c" test_acc) (GPU/CPU; tolerances $LOSS_TOL, $ACC_TOL)"
  echo "$NOTE" >>"$logfile"
  return "$ok"
}

# The GPT-2 124M benchmark (scripts/bench/gpt_bench.sh --gpu): dpt-model-bench and dptrain against PyTorch eager and
# torch.compile, with the per-kernel breakdown. It runs before the MLP and ResNet benchmarks and leaves them
# GPU_CHECK_BENCH_RESERVE_S (default 140: on 2026-11-27 they took 31 and 68 s, and since then the MLP's runs have 4
# epochs and the ResNet's dptrain rows sweep cuDNN's convolution algorithms) of the budget; gpt_bench.sh ends its runs
# by the deadline it is given, so its report is written even when time runs short (rows not run say so). Its rows
# leave out the float32 activations' step and loop (`step`, `loop`: 25 and 24 s on the H200, their numbers unchanged
# since the first window; GPU_CHECK_GPT_ROWS adds them back): in the third window of 2026-11-27 the run had 145 s and
# the last row, `fastnd`, found its deadline passed. `fastnd` (measured in two windows: about 1%) has made way for
# `fastgraph`, the step as one CUDA graph (ran on 2026-11-29).
step_bench_gpt() {
  local logfile=$1 rc=0 left limit
  left=$((DEADLINE - $(date +%s) - 20))
  limit=$((left - ${GPU_CHECK_BENCH_RESERVE_S:-140}))
  ((limit <= 420)) || limit=420
  if ((limit < 60)); then
    NOTE="not started: ${left}s left of the budget, ${GPU_CHECK_BENCH_RESERVE_S:-140}s of them kept for the other"
    NOTE+=" benchmarks"
    return 1
  fi
  run_timed "$logfile" "$limit" env OUT="${OUT:-}" MODEL_BENCH="$B_BIN/dpt-model-bench" DPTRAIN="$B_BIN/dptrain" \
    DPRUN="$B_BIN/dprun" DPT_LIB_PATH="$DPT_LD" GPT_CONFIG="$BUNDLE/configs/gpt2_124m.toml" \
    BENCH_ROWS="${GPU_CHECK_GPT_ROWS:-fast compile eager fastloop fasttune fastgraph fastloopgraph}" \
    BENCH_LOG_DIR="$STEP_DIR/bench_gpt" BENCH_DEADLINE=$(($(date +%s) + limit - 15)) BENCH_WARMUP=3 BENCH_STEPS=20 \
    BENCH_PHASE_STEPS=3 BENCH_PROFILE_STEPS=3 BENCH_RUN_TIMEOUT_S=180 BENCH_RESULTS="$STEP_DIR/results-gpt.jsonl" \
    bash scripts/bench/gpt_bench.sh --gpu || rc=$?
  grep -E '^\||^targets|^dptrain.s step by phase|^GEMM kernels|^Matrix products|^Floors' "$logfile" | tee -a "$MAIN_LOG" || true
  NOTE=$(grep -E '^targets' "$logfile" | tail -1 || true)
  ((rc == 0)) || NOTE="exit $rc ${NOTE}"
  return $((rc != 0))
}

# `dptrain generate` on the GPU against the CPU (issue 30, item 4), from the checkpoint train_cuda_gpt wrote (fp32):
# greedy (--top-k 1) and sampled with a seed (--seed 7, temperature 1), 64 bytes each. PASS when each pair of texts
# is equal; else the note says at which character they part (fp32 logits can round differently on the two sides).
step_generate_gpu_cpu() {
  local logfile=$1 ckpt=$WORK/train_cuda_gpt/checkpoints mode dev rc ok=0 a b i
  passed_in_this_run train_cuda_gpt || return 1
  [ -d "$ckpt" ] || ckpt=$WORK/train_cuda_gpt
  if ! ls -d "$ckpt"/step-* >/dev/null 2>&1 && ! ls -d "$ckpt"/*/step-* >/dev/null 2>&1; then
    NOTE="no checkpoint under $WORK/train_cuda_gpt (did train_cuda_gpt run?)"
    return 1
  fi
  NOTE=""
  for mode in greedy seeded; do
    local args=(--tokens 64 --prompt "The ")
    [ "$mode" = greedy ] && args+=(--top-k 1) || args+=(--seed 7)
    for dev in cuda cpu; do
      rc=0
      echo "---- $mode on $dev:" >>"$logfile"
      # The text (stdout) into its own file; the logs (stderr) into the step's log.
      run_timed "$logfile" 60 bash -c 'out=$1; shift; exec "$@" >"$out"' _ "$WORK/generate_${mode}_$dev.txt" \
        "${DPT_ENV[@]}" "$B_BIN/dptrain" generate --checkpoint "$ckpt" --device "$dev" "${args[@]}" || rc=$?
      cat "$WORK/generate_${mode}_$dev.txt" >>"$logfile" 2>/dev/null || true
      if ((rc != 0)); then
        NOTE+="$mode on $dev: exit $rc$(first_error "$logfile"); "
        ok=1
      fi
    done
    ((ok == 0)) || continue
    a=$(cat "$WORK/generate_${mode}_cuda.txt")
    b=$(cat "$WORK/generate_${mode}_cpu.txt")
    if [ "$a" = "$b" ] && [ -n "$a" ]; then
      NOTE+="$mode: GPU text = CPU text (${#a} chars); "
    else
      i=0
      while ((i < ${#a} && i < ${#b})) && [ "${a:i:1}" = "${b:i:1}" ]; do i=$((i + 1)); done
      NOTE+="$mode: GPU and CPU texts part at character $i of ${#a}/${#b}; "
      ok=1
    fi
  done
  echo "$NOTE" >>"$logfile"
  return "$ok"
}

# -- set-up and summary ---------------------------------------------------------------------------------

# The unit tests look for the data set in /usr/share/datasets/fashion-mnist (skipped when absent). Where that
# path does not exist here, point it at the bundle's data for the run: a symbolic link, removed at exit, with
# any folder made for it. GPU_CHECK_NO_LINKS=1: none. (The shipped configs need no link: UNIT_ENV sets
# DPT_SOURCE_DIR, which test_config honours, to the bundle, which carries configs/.)
make_link() {
  local target=$1 link=$2 top d
  if [ -e "$link" ] || [ -L "$link" ]; then return 0; fi
  top=$(dirname "$link")
  d=$top
  while [ ! -e "$d" ]; do top=$d d=$(dirname "$d"); done
  [ -e "$top" ] && top=""  # every parent existed
  if ! { mkdir -p "$(dirname "$link")" && ln -s "$target" "$link"; }; then
    log "could not make the temporary link $link"
    return 0
  fi
  LINKS_MADE+=("$link|$top")
  log "temporary link (removed at exit): $link -> $target"
}

remove_links() {
  local entry link top d
  for entry in "${LINKS_MADE[@]}"; do
    link=${entry%%|*} top=${entry#*|}
    rm -f "$link"
    if [ -n "$top" ]; then  # remove the folders made for it, bottom up, up to the top one
      d=$(dirname "$link")
      while rmdir "$d" 2>/dev/null && [ "$d" != "$top" ]; do d=$(dirname "$d"); done
    fi
  done
}

make_compat_links() {
  [ "${GPU_CHECK_NO_LINKS:-0}" != 1 ] || return 0
  make_link "$ROOT/$BUNDLE/data" "$FMNIST_DIR"
}

# The cuDNN library dptrain loads with DPT_LD (its path as ldd resolves it; empty when none is found).
loaded_cudnn() {
  env LD_LIBRARY_PATH="${DPT_LD:-}" ldd "$B_BIN/dptrain" 2>/dev/null | awk '$1 ~ /^libcudnn/ && $3 != "not" { print $3; exit }' || true
}

header() {
  log "gpu-check run: $(date -u +%Y-%m-%dT%H:%M:%SZ) on ${HOSTNAME:-?} in $ROOT, budget ${BUDGET}s"
  log "bundle: $(info_get created), commit $(info_get git_head) (+$(info_get git_changed_files) changed files), cuda_build=$(info_get cuda_build)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>&1 | tee -a "$MAIN_LOG" || true
    log "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1)"
  else
    log "WARNING: no nvidia-smi here"
  fi
  local have need
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }' || true)
  need=$(info_get glibc_needed)
  log "glibc: ${have:-unknown} (bundle needs >= ${need:-?}); libstdc++ from $([ "$USING_COMPAT" = yes ] && echo "the bundle (the machine's is too old)" || echo "the machine")"
  if [ -n "$have" ] && [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
    log "WARNING: this glibc ($have) is older than the bundle needs ($need): the programs will not start"
  fi
  log "programs: $B_BIN ($(cd "$B_BIN" && echo *))"
  log "LD_LIBRARY_PATH for them: $DPT_LD"
  local nf
  nf=$(env LD_LIBRARY_PATH="$DPT_LD" ldd "$B_BIN/dptrain" 2>&1 | grep 'not found' || true)
  [ -z "$nf" ] || log "WARNING: dptrain's libraries not found: $(echo "$nf" | awk '{ print $1 }' | tr '\n' ' ')"
  if [[ " $(info_get machine_cuda_libs) " == *" libcudnn"* ]]; then
    local cudnn
    cudnn=$(loaded_cudnn)
    log "cuDNN: ${cudnn:-NOT FOUND (no nvidia/cudnn wheel?): the programs will not start} (built with $(info_get cudnn_version))"
  fi
  log "logs: $MAIN_LOG, one per step in $STEP_DIR/"
}

# gpu-results.json beside the logs: this run's device, the bundle's commit, every step and the benchmarks' rows
# (scripts/bench/results.py). Commit it with `python3 scripts/bench/results.py merge $OUT/gpu-results.json
# docs/gpu-results.json` and `... tables docs/gpu-results.json docs/benchmarks.md` (docs/DEVELOPERS.md).
write_results() {
  local i steps=$STEP_DIR/steps.tsv smi driver device cudnn_lib
  : >"$steps"
  for i in "${!STEP_NAMES[@]}"; do
    printf '%s\t%s\t%s\t%s\n' "${STEP_NAMES[$i]}" "${STEP_RESULTS[$i]}" "${STEP_SECONDS[$i]}" "${STEP_NOTES[$i]//$'\t'/ }" >>"$steps"
  done
  smi=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
  device=${smi%%,*} driver=${smi#*, }
  [ -n "$smi" ] || device="no GPU (nvidia-smi found none)" driver="-"
  cudnn_lib=$(loaded_cudnn)
  [ -z "$cudnn_lib" ] || cudnn_lib=$(readlink -f "$cudnn_lib")
  python3 scripts/bench/results.py run --out "$LOG_ROOT/gpu-results.json" --steps "$steps" --info "device=$device" \
    "driver=$driver" "cuda=$(info_get cuda_version)" "cudnn=$(info_get cudnn_version)" "cudnn_library=${cudnn_lib:-?}" \
    "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)" "commit=$(info_get git_head_full)" \
    "changed_files=$(info_get git_changed_files)" "budget_s=$BUDGET" "host=${HOSTNAME:-?}" "only=${ONLY[*]}" \
    "$STEP_DIR"/results-gpt.jsonl "$STEP_DIR"/results-mlp.jsonl "$STEP_DIR"/results-resnet.jsonl &&
    log "results: $LOG_ROOT/gpu-results.json" || log "WARNING: gpu-results.json not written"
}

# With OUT set (the device tool, which brings back at most 8 files): the per-step logs and benchmark runs
# packed into gpu-check-logs.tar.xz (nsys's reports left out: they can be large; its CSV stays), the folder removed.
pack_logs() {
  [ -n "${OUT:-}" ] && [ -d "$STEP_DIR" ] || return 0
  if tar -C "$LOG_ROOT" -cJf "$LOG_ROOT/gpu-check-logs.tar.xz" --exclude='*.nsys-rep' --exclude='*.qdrep' \
    --exclude='*.sqlite' "$(basename "$STEP_DIR")" 2>/dev/null; then
    rm -rf "$STEP_DIR"
    log "logs: $LOG_ROOT/gpu-check-logs.tar.xz (the per-step logs and benchmark runs)"
  fi
}

summary() {
  local i failed=0 table
  table=$(
    echo "| step | result | time | note |"
    echo "|---|---|---|---|"
    for i in "${!STEP_NAMES[@]}"; do
      echo "| ${STEP_NAMES[$i]} | ${STEP_RESULTS[$i]} | ${STEP_SECONDS[$i]}s | ${STEP_NOTES[$i]} |"
    done
  )
  for i in "${!STEP_RESULTS[@]}"; do [ "${STEP_RESULTS[$i]}" = PASS ] || failed=$((failed + 1)); done
  log ""
  log "==== summary ($(($(date +%s) - START))s)"
  log "$table"
  echo "$table" >"$LOG_ROOT/gpu-check-summary.md"
  write_results
  # For run --again on this machine: the step table (a run --only's selection, merged into the last full table).
  mkdir -p "$STATE_DIR"
  if [ -s "$STEP_DIR/steps.tsv" ]; then
    if [ -s "$STATE_DIR/steps.tsv" ] && ((${#ONLY[@]})); then
      awk -F'\t' 'NR == FNR { new[$1] = $0; next } ($1 in new) { print new[$1]; delete new[$1]; next } { print }
        END { for (k in new) print new[k] }' "$STEP_DIR/steps.tsv" "$STATE_DIR/steps.tsv" >"$STATE_DIR/steps.new"
      mv "$STATE_DIR/steps.new" "$STATE_DIR/steps.tsv"
    else
      cp "$STEP_DIR/steps.tsv" "$STATE_DIR/steps.tsv"
    fi
  fi
  pack_logs
  if ((failed)); then
    log "gpu-check: $failed of ${#STEP_NAMES[@]} steps FAILED"
    return 1
  fi
  log "gpu-check: all ${#STEP_NAMES[@]} steps passed"
}

# require_gpu WHAT: the GPU check (run, resnet-bench, gpt-bench) needs a GPU. Without one every GPU step fails (no
# regression: no GPU) and run's record would hold those FAILs beside the CPU steps' PASSes under the device "no GPU".
# nvidia-smi names the record's device, so it decides, unless the driver's /dev/nvidiaN files say otherwise.
require_gpu() {
  local why="no nvidia-smi here" gpus
  if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>&1 || true)  # read whole: grep -q in a pipe could fail it with SIGPIPE under pipefail
    grep -q '^GPU [0-9]' <<<"$gpus" && return 0
    why="nvidia-smi -L lists no GPU: $(head -1 <<<"$gpus")"
  fi
  # A lent GPU is worth more than the check's tidiness: where the driver's device files are there, run anyway (the
  # steps say what works) rather than lose the window to a missing or failing nvidia-smi.
  if compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
    echo "gpu-check: WARNING: $why, but $(compgen -G '/dev/nvidia[0-9]*' | head -1) exists: running" >&2
    return 0
  fi
  if [ "${GPU_CHECK_ALLOW_NO_GPU:-0}" = 1 ]; then
    echo "gpu-check: WARNING: no GPU ($why); GPU_CHECK_ALLOW_NO_GPU=1: the GPU steps will fail" >&2
    return 0
  fi
  local what="nothing run, no gpu-results.json written"
  [ "$1" = run ] || what="no benchmark run (its GPU rows could only fail)"
  die "$1: no GPU on this machine ($why): $what. The GPU check runs on a GPU machine (docs/DEVELOPERS.md);" \
    "GPU_CHECK_ALLOW_NO_GPU=1 runs it here anyway (the GPU steps then fail)"
}

run_all() {
  if [ "${1:-}" = --list ]; then
    LIST_ONLY=1
    shift
  fi
  case ${1:-} in
    --only)
      shift
      (($#)) || die "run --only needs step names (shell patterns), e.g. run --only 'bench_*'"
      ONLY=("$@")
      ;;
    --again) ;;  # select_again, once the log is open
    "") ;;
    *) die "run: unknown option $1 (run, run --only STEP..., run --again, run --list ...)" ;;
  esac
  if ((LIST_ONLY)); then
    list_steps "$@"
    return
  fi
  require_gpu run
  BUDGET=${GPU_CHECK_BUDGET_S:-540}
  START=$(date +%s)
  DEADLINE=$((START + BUDGET))
  mkdir -p "$STEP_DIR" "$WORK"
  : >"$MAIN_LOG"
  unpack_bundle
  setup_libpath
  DPT_ENV=(env "LD_LIBRARY_PATH=$DPT_LD")
  bundle_openmpi_env
  # As under ctest; DPT_SOURCE_DIR: test_config reads the shipped configs from the bundle's configs/.
  UNIT_ENV=("${DPT_ENV[@]}" OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "DPT_SOURCE_DIR=$ROOT/$BUNDLE")
  header
  [ "${1:-}" != --again ] || select_again
  ((${#ONLY[@]} == 0)) || log "steps: only those matching ${ONLY[*]}"
  trap remove_links EXIT
  make_compat_links
  run_steps
  summary
}

# run --list: the steps run_steps would run, by name, one a line on stdout (what --again selects on stderr); nothing
# run, no bundle unpacked, no log written.
list_steps() {
  log() { printf '%s\n' "$*" >&2; }
  B_BIN=$BUNDLE/bin
  [ -d "$B_BIN" ] || B_BIN=${DPT_BUILD_DIR:-build}/tests
  [ "${1:-}" != --again ] || select_again
  run_steps
}

# Every step in its order: the background and lane steps started first, then each waited for (run_step) at its place.
run_steps() {

  # Beside the GPU steps (start_background): the CPU halves, then the CPU unit tests that start no network or
  # processes (unit_comm and unit_launcher run in the foreground, after the GPU steps, before the benchmarks).
  start_background train_cpu_1rank step_train_cpu
  start_background train_cpu_gpt step_train_gpt_cpu
  start_background train_cpu_gpt_bf16act step_train_gpt_cpu train.precision=bf16 train.bf16_activations=true
  start_background train_cpu_llama step_train_llama_cpu
  start_background train_cpu_llama_bf16act step_train_llama_cpu train.precision=bf16 train.bf16_activations=true
  local t units=() quiet_units=(unit_core unit_trainer unit_models unit_data)
  for t in "${quiet_units[@]}"; do
    [ -x "$B_BIN/$t" ] && start_background "$t" step_unit "$t"
  done
  # The GPU steps in five lanes side by side (start_lane), each lane's in the order below; the comparisons of two
  # lanes' runs (compare_*) run in the foreground at their places.
  start_lane "unit_gpu step_unit_gpu" "sanitize_fastpath step_sanitize_fastpath"
  start_lane "nccl_watchdog step_nccl_watchdog" "train_cuda_nccl_1rank step_train_gpu" \
    "train_cuda_gloo_2rank step_train_gloo2" \
    "train_cuda_gloo_2rank_grad_bf16 step_train_gloo2 dist.grad_dtype=bf16" \
    "train_cuda_gloo_2rank_zero1_clip_bf16 step_train_gloo2 dist.zero=1 train.clip_grad_norm=1.0 dist.grad_dtype=bf16" \
    "train_cuda_mpi_2rank step_train_mpi2" \
    "train_cuda_mpi_2rank_zero1_clip_bf16 step_train_mpi2 dist.zero=1 train.clip_grad_norm=1.0 dist.grad_dtype=bf16" \
    "memory_cuda step_memory_gpu" "oom_cuda step_oom_gpu"
  start_lane "equiv_cuda_1rank_b128 step_equiv_1rank" "equiv_cuda_gloo_2rank step_equiv_2rank gloo" \
    "equiv_cuda_mpi_2rank step_equiv_2rank mpi" "equiv_cuda_gloo_2rank_zero1 step_equiv_zero 1" \
    "equiv_cuda_gloo_2rank_zero2 step_equiv_zero 2" "equiv_cuda_gloo_2rank_zero3 step_equiv_zero 3"
  start_lane "train_cuda_resnet_fp32 step_train_resnet fp32" "train_cuda_resnet_bf16 step_train_resnet bf16" \
    "train_cuda_resnet_fp16 step_train_resnet fp16" "predict_gpu_cpu step_predict_gpu_cpu" \
    "memory_vs_torch step_memory_vs_torch" "torchrun_2x step_torchrun"
  start_lane "train_cuda_gpt step_train_gpt_gpu" "generate_gpu_cpu step_generate_gpu_cpu" \
    "train_cuda_gpt_bf16act step_train_gpt_gpu train.precision=bf16 train.bf16_activations=true" \
    "train_cuda_gpt_autotune step_train_gpt_autotune" "train_cuda_gpt_graph step_train_gpt_graph" \
    "train_cuda_llama step_train_llama_gpu" \
    "train_cuda_llama_bf16act step_train_llama_gpu train.precision=bf16 train.bf16_activations=true"

  run_step unit_gpu step_unit_gpu
  run_step sanitize_fastpath step_sanitize_fastpath
  run_step nccl_watchdog step_nccl_watchdog
  run_step train_cuda_nccl_1rank step_train_gpu
  run_step train_cpu_1rank step_train_cpu
  run_step compare_gpu_cpu step_compare
  run_step train_cuda_gloo_2rank step_train_gloo2
  run_step train_cuda_gloo_2rank_grad_bf16 step_train_gloo2 dist.grad_dtype=bf16
  run_step train_cuda_gloo_2rank_zero1_clip_bf16 step_train_gloo2 dist.zero=1 train.clip_grad_norm=1.0 dist.grad_dtype=bf16
  run_step equiv_cuda_1rank_b128 step_equiv_1rank
  run_step equiv_cuda_gloo_2rank step_equiv_2rank gloo
  run_step equiv_cuda_mpi_2rank step_equiv_2rank mpi
  for t in 1 2 3; do run_step "equiv_cuda_gloo_2rank_zero$t" step_equiv_zero "$t"; done
  run_step train_cuda_mpi_2rank step_train_mpi2
  run_step train_cuda_mpi_2rank_zero1_clip_bf16 step_train_mpi2 dist.zero=1 train.clip_grad_norm=1.0 \
    dist.grad_dtype=bf16
  run_step memory_cuda step_memory_gpu
  run_step memory_vs_torch step_memory_vs_torch
  run_step oom_cuda step_oom_gpu
  for p in fp32 bf16 fp16; do run_step "train_cuda_resnet_$p" step_train_resnet "$p"; done
  run_step predict_gpu_cpu step_predict_gpu_cpu
  run_step train_cuda_gpt step_train_gpt_gpu
  run_step train_cpu_gpt step_train_gpt_cpu
  run_step compare_gpt_gpu_cpu step_compare_gpt
  run_step generate_gpu_cpu step_generate_gpu_cpu
  # The transformer fast path (cuBLASLt, cuDNN's fused attention, the fused classifier and AdamW) against its CPU
  # reference loops, through the whole product.
  run_step train_cuda_gpt_bf16act step_train_gpt_gpu train.precision=bf16 train.bf16_activations=true
  run_step train_cpu_gpt_bf16act step_train_gpt_cpu train.precision=bf16 train.bf16_activations=true
  run_step compare_gpt_bf16act_gpu_cpu step_compare_gpt train_cuda_gpt_bf16act train_cpu_gpt_bf16act 5
  run_step train_cuda_gpt_autotune step_train_gpt_autotune
  run_step compare_gpt_autotune_gpu_cpu step_compare_gpt train_cuda_gpt_autotune train_cpu_gpt_bf16act 5
  # train.cuda_graph (ran on 2026-11-29): the same run, each step (with clipping, AdamW) one CUDA graph, bit for bit.
  run_step train_cuda_gpt_graph step_train_gpt_graph
  run_step compare_gpt_graph_eager step_compare_gpt_graph_eager
  # The Llama family (configs/llama_tiny.toml: grouped-query attention, RMSNorm, RoPE, SwiGLU) the same ways: float32
  # activations, then its fast path (q/k/v packed for cuDNN's grouped-query attention, bf16 RMSNorm, SwiGLU, RoPE).
  run_step train_cuda_llama step_train_llama_gpu
  run_step train_cpu_llama step_train_llama_cpu
  run_step compare_llama_gpu_cpu step_compare_gpt train_cuda_llama train_cpu_llama
  run_step train_cuda_llama_bf16act step_train_llama_gpu train.precision=bf16 train.bf16_activations=true
  run_step train_cpu_llama_bf16act step_train_llama_cpu train.precision=bf16 train.bf16_activations=true
  run_step compare_llama_bf16act_gpu_cpu step_compare_gpt train_cuda_llama_bf16act train_cpu_llama_bf16act 5
  run_step torchrun_2x step_torchrun
  # The CPU unit tests before the benchmarks (about 20 s in all; the 2026-11-27 window's budget ran out on
  # unit_launcher after them): CI runs them on every change; here they show the bundle's programs work on this
  # machine with a GPU present (the device and memory tests take the CUDA branch). The benchmarks then take what the
  # budget leaves (their own deadline).
  for t in unit_core unit_trainer unit_models unit_comm unit_data unit_launcher; do
    [ -x "$B_BIN/$t" ] && units+=("$t")
  done
  for t in "$B_BIN"/unit_*; do  # any other unit test program, in name order
    [ -f "$t" ] && [ -x "$t" ] || continue  # (run --list from a build tree: its CMake files too)
    t=$(basename "$t")
    [[ $t == unit_gpu || " ${units[*]} " == *" $t "* ]] || units+=("$t")
  done
  for t in "${units[@]}"; do run_step "$t" step_unit "$t"; done
  wait_background  # nothing else on the CPU while the benchmarks time
  run_step loader_bench step_loader_bench
  run_step bench_gpt step_bench_gpt
  run_step bench step_bench
  run_step bench_resnet step_bench_resnet
  ((${#STEP_NAMES[@]})) || die "run: no step matches ${ONLY[*]} (the step names are in docs/DEVELOPERS.md)"
}

# Only the ResNet benchmark, with the bundle's programs (no budget: resnet_bench.sh's own per-run timeouts).
resnet_bench_only() {
  require_gpu resnet-bench
  unpack_bundle
  setup_libpath
  echo "gpu-check resnet-bench: $(nvidia-smi -L 2>/dev/null | head -1 || echo 'no nvidia-smi'); bundle $(info_get created), commit $(info_get git_head) (+$(info_get git_changed_files) changed files)"
  env OUT="${OUT:-}" MODEL_BENCH="$B_BIN/dpt-model-bench" DPT_LIB_PATH="$DPT_LD" \
    BENCH_LOG_DIR="${OUT:-/tmp}/resnet-bench-logs" bash scripts/bench/resnet_bench.sh --gpu
}

# Only the GPT-2 124M benchmark, with the bundle's programs (no budget: gpt_bench.sh's own per-run timeouts).
gpt_bench_only() {
  require_gpu gpt-bench
  unpack_bundle
  setup_libpath
  echo "gpu-check gpt-bench: $(nvidia-smi -L 2>/dev/null | head -1 || echo 'no nvidia-smi'); bundle $(info_get created), commit $(info_get git_head) (+$(info_get git_changed_files) changed files)"
  env OUT="${OUT:-}" MODEL_BENCH="$B_BIN/dpt-model-bench" DPTRAIN="$B_BIN/dptrain" DPRUN="$B_BIN/dprun" \
    DPT_LIB_PATH="$DPT_LD" GPT_CONFIG="$BUNDLE/configs/gpt2_124m.toml" BENCH_LOG_DIR="${OUT:-/tmp}/gpt-bench-logs" \
    bash scripts/bench/gpt_bench.sh --gpu
}

case ${1:-} in
  bundle) bundle ;;
  run) shift; run_all "$@" ;;
  resnet-bench) resnet_bench_only ;;
  gpt-bench) gpt_bench_only ;;
  unpack)
    unpack_bundle
    echo "unpacked into $B_BIN and $B_LIB; try: LD_LIBRARY_PATH=$(setup_libpath && echo "$DPT_LD") $B_BIN/dptrain --help"
    ;;
  mpirun)
    shift
    unpack_bundle
    setup_libpath
    bundle_openmpi_env
    exec env "LD_LIBRARY_PATH=$DPT_LD" "${OMPI_ENV[@]}" "$B_BIN/mpirun" "$@"
    ;;
  openmpi-stage) openmpi_stage_only "${2:-}" ;;
  openmpi-env) openmpi_env "${2:?openmpi-env needs the lib folder}" ;;
  libpath)
    unpack_bundle
    setup_libpath
    echo "$DPT_LD"
    ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    [ -z "${1:-}" ] || echo "gpu-check: unknown command '$1'" >&2
    exit 2
    ;;
esac
