#!/usr/bin/env bash
# Installs the Debian packages dptrain needs to build, test and run, when any is missing, and (tests only) PyPI's
# tensorboard in the venv /opt/dptrain/test-venv. Idempotent: when everything is present it only checks and returns.
#   --bench  accepted for compatibility: Debian's PyTorch (python3-torch, python3-torchvision), the
#            benchmarks' reference, is now always installed because the ResNet parity tests need it.
set -euo pipefail

for arg in "$@"; do
  case $arg in
    --bench) ;; # accepted: the benchmarks' packages are always installed now
    -h | --help)
      echo "usage: $0 [--bench]   (--bench: accepted; python3-torch is always installed now)"
      exit 0
      ;;
    *)
      echo "setup: unknown argument '$arg' (usage: $0 [--bench])" >&2
      exit 2
      ;;
  esac
done

PKGS=(
  build-essential cmake pkg-config
  libopenblas-dev                    # CPU GEMMs
  openmpi-bin libopenmpi-dev         # MPI backend, mpirun
  libgloo-dev                        # Gloo backend
  libcli11-dev libspdlog-dev libfmt-dev
  catch2                             # unit tests
  libtomlplusplus-dev nlohmann-json3-dev zlib1g-dev
  libpcre2-dev                       # GPT-2 BPE: the pre-tokenizer regex (\p{L}, lookahead, UTF-8)
  libjpeg62-turbo-dev libpng-dev     # image folders: JPEG (libjpeg-turbo) and PNG decoding and writing
  libdnnl-dev                        # oneDNN: the CPU convolutions (fp32, and bf16 on AVX-512)
  ocl-icd-opencl-dev                 # libdnnl-dev's CMake config requires OpenCL (its GPU runtime); only recommended, so named
  dataset-fashion-mnist              # the default data set (/usr/share/datasets/fashion-mnist)
  fortunes                           # the default text corpus for `dptrain tokenize` (/usr/share/games/fortunes, ~2.5 MB)
  python3-numpy                      # tests only: reads our safetensors checkpoints with numpy alone
  python3-regex                      # tests only: GPT-2's encoder.py algorithm, the reference for our BPE
  clang libclang-rt-14-dev           # tests only: libFuzzer + ASan/UBSan (scripts/fuzz.sh); clang 14 on Debian 12, whose libFuzzer runtime is in libclang-rt-14-dev (only recommended, so named)
  slurmd slurmctld slurm-client munge  # tests only: integration.slurm starts a real one-node Slurm cluster on localhost
  iproute2  # tests only: integration.two_hosts joins two network namespaces with a veth pair
  libprotobuf-dev protobuf-compiler  # TensorBoard event files: Event/Summary protobufs from trainer/tensorboard.proto
  libboost-dev                       # Boost.CRC: the masked CRC32C of TFRecord framing (header-only)
  gnuplot-nox                        # dptrain plot: the loss curves PNG (pngcairo terminal)
  python3-venv                       # tests only: the venv that holds PyPI tensorboard (below)
)
# Tests only, as the reference: ResNet parity with torchvision (logits, gradients, weights both ways). The
# benchmarks use them too. About 250 MB installed with libtorch.
PKGS+=(python3-torch python3-torchvision)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all packages present"
fi

# Tests only: TensorBoard's own event-file reader, which integration.tensorboard reads dptrain's event files back
# with. From PyPI (Debian has no tensorboard), in a venv of its own so that pip never touches Debian's Python; the
# venv sees Debian's numpy through --system-site-packages. Installed only when the venv cannot import it.
TEST_VENV=/opt/dptrain/test-venv  # tests/integration/tensorboard.sh names the same path
if "$TEST_VENV/bin/python" -c "import tensorboard" 2>/dev/null; then
  echo "setup: $TEST_VENV has tensorboard"
else
  echo "setup: installing PyPI tensorboard into $TEST_VENV (tests only)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO /usr/bin/python3 -m venv --system-site-packages "$TEST_VENV"
  $SUDO "$TEST_VENV/bin/pip" install --quiet --disable-pip-version-check "tensorboard==2.21.0"
fi
