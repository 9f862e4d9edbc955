#!/usr/bin/env bash
# Installs the Debian packages dptrain needs, by purpose, when any is missing. Idempotent: when everything asked
# for is present it only checks and returns.
#   (no option)  building and training: compiler, cmake, the libraries the build finds (Catch2 included: the
#                default build compiles the tests too), the data set, the text corpus, gnuplot (curves); where
#                the CUDA toolkit is, the cuDNN frontend's headers from PyPI (below).
#                scripts/run.sh runs this.
#   --bench      adds the benchmarks' reference: Debian's PyTorch (python3-torch, python3-torchvision).
#   --tests      adds every test-only tool: PyTorch and torchvision (parity tests), numpy, regex, clang with
#                libFuzzer, Slurm and munge, iproute2, strace, and PyPI's tensorboard and transformers in the venv
#                /opt/dptrain/test-venv.
#                scripts/test.sh runs this.
set -euo pipefail

BENCH=0
TESTS=0
usage="usage: $0 [--tests] [--bench]   (--tests: add the test-only tools; --bench: add PyTorch, the benchmarks' reference)"
for arg in "$@"; do
  case $arg in
    --bench) BENCH=1 ;;
    --tests) TESTS=1 ;;
    -h | --help)
      echo "$usage"
      exit 0
      ;;
    *)
      echo "setup: unknown argument '$arg' ($usage)" >&2
      exit 2
      ;;
  esac
done

# Building and training (scripts/run.sh).
PKGS=(
  build-essential cmake pkg-config
  ccache                             # CMake compiles through it: another clone of the same sources hits its cache
  libopenblas-dev                    # CPU GEMMs
  openmpi-bin libopenmpi-dev         # MPI backend, mpirun
  libgloo-dev                        # Gloo backend
  libcli11-dev libspdlog-dev libfmt-dev
  catch2                             # the unit tests, which the default build (DPT_BUILD_TESTS=ON) compiles
  libtomlplusplus-dev nlohmann-json3-dev zlib1g-dev
  libpcre2-dev                       # GPT-2 BPE: the pre-tokenizer regex (\p{L}, lookahead, UTF-8)
  libutf8proc-dev                    # tokenizer.json's NFC normalizer (Qwen2's)
  libzip-dev                         # PyTorch's torch.save files (.pth, pytorch_model.bin) for model.init_from
  libjpeg62-turbo-dev libpng-dev     # image folders: JPEG (libjpeg-turbo) and PNG decoding and writing
  libdnnl-dev                        # oneDNN: the CPU convolutions (fp32, and bf16 on AVX-512)
  ocl-icd-opencl-dev                 # libdnnl-dev's CMake config requires OpenCL (its GPU runtime); only recommended, so named
  libprotobuf-dev protobuf-compiler  # TensorBoard event files: Event/Summary protobufs from trainer/report/tensorboard.proto
  libboost-dev                       # Boost.CRC: the masked CRC32C of TFRecord framing (header-only)
  dataset-fashion-mnist              # the default data set (/usr/share/datasets/fashion-mnist)
  fortunes                           # the default text corpus for `dptrain tokenize` (/usr/share/games/fortunes, ~2.5 MB)
  gnuplot-nox                        # dptrain plot and log.curves: the loss curves PNG (pngcairo terminal)
)
# The reference of the benchmarks and of the ResNet/GPT parity tests (tests/support/python/torch_*.py). About
# 250 MB installed with libtorch.
TORCH_PKGS=(python3-torch python3-torchvision)
# Tests only (scripts/test.sh).
TEST_PKGS=(
  python3-numpy                      # reads our safetensors checkpoints with numpy alone (tests/support/python/ckpt.py)
  python3-regex                      # GPT-2's encoder.py algorithm, the reference for our BPE
  clang libclang-rt-14-dev           # libFuzzer + ASan/UBSan (scripts/fuzz.sh); clang 14 on Debian 12, whose libFuzzer runtime is in libclang-rt-14-dev (only recommended, so named)
  slurmd slurmctld slurm-client munge  # integration.slurm starts a real one-node Slurm cluster on localhost
  iproute2                           # integration.two_hosts joins two network namespaces with a veth pair
  strace                             # integration.train_resume_edges kills a run at an exact system call
  python3-venv                       # the venv that holds PyPI tensorboard and transformers (below)
)
((BENCH || TESTS)) && PKGS+=("${TORCH_PKGS[@]}")
((TESTS)) && PKGS+=("${TEST_PKGS[@]}")

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# An install that cannot happen says what to do, instead of ending on apt's or pip's last line (or "sudo: command not
# found") with no word from setup. $1: what failed; the rest: the packages.
install_failed() {
  local what=$1
  shift
  echo "setup: error: $what could not install $* (no network, no apt source or proxy that serves Debian 12, or" \
    "not allowed to). Fix that and run this again, or install them yourself: apt-get install $*" >&2
  exit 1
}
need_root() {
  [ -z "$SUDO" ] || command -v sudo >/dev/null 2>&1 ||
    { echo "setup: error: $* missing, and installing needs root: run this as root, or install sudo" >&2; exit 1; }
}

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  need_root "${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq || install_failed "apt-get update" "${missing[@]}"
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    install_failed "apt-get install" "${missing[@]}"
else
  echo "setup: all packages present"
fi

# The GPU path's attention (models/kernels/cuda/attention.cpp) calls cuDNN's fused flash attention through NVIDIA's
# cuDNN frontend, a header-only C++ library that NVIDIA publishes on PyPI (nvidia-cudnn-frontend: the headers sit in
# the wheel's include/). Only where the CUDA toolkit is (nvcc at /usr/local/cuda or on PATH): the headers, unpacked
# by pip into $CUDNN_FE_DIR, which CMake looks in (CMakeLists.txt: CUDNN_FRONTEND_ROOT). pip comes from a venv of
# its own ($CUDNN_FE_VENV: Debian's python3 has no pip); no Python is used at build or run time.
CUDNN_FE_VERSION=1.32.0
CUDNN_FE_DIR=/opt/dptrain/cudnn-frontend-$CUDNN_FE_VERSION
CUDNN_FE_VENV=/opt/dptrain/pip-venv
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  if [ -f "$CUDNN_FE_DIR/include/cudnn_frontend.h" ]; then
    echo "setup: cuDNN frontend $CUDNN_FE_VERSION headers present ($CUDNN_FE_DIR/include)"
  else
    dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "install ok installed" || {
      need_root python3-venv
      $SUDO apt-get update -qq || install_failed "apt-get update" python3-venv
      $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null ||
        install_failed "apt-get install" python3-venv
    }
    need_root "the cuDNN frontend's headers ($CUDNN_FE_DIR)"
    [ -x "$CUDNN_FE_VENV/bin/pip" ] || $SUDO /usr/bin/python3 -m venv "$CUDNN_FE_VENV"
    echo "setup: installing PyPI nvidia-cudnn-frontend==$CUDNN_FE_VERSION's headers into $CUDNN_FE_DIR"
    $SUDO "$CUDNN_FE_VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps \
      --target "$CUDNN_FE_DIR" "nvidia-cudnn-frontend==$CUDNN_FE_VERSION" || {
      echo "setup: error: pip could not fetch nvidia-cudnn-frontend==$CUDNN_FE_VERSION from PyPI (no network or" \
        "no pip index?): fix that and run this again, or unpack that wheel into $CUDNN_FE_DIR yourself" >&2
      exit 1
    }
    [ -f "$CUDNN_FE_DIR/include/cudnn_frontend.h" ] ||
      { echo "setup: error: $CUDNN_FE_DIR/include/cudnn_frontend.h missing after pip install" >&2; exit 1; }
  fi
fi

((TESTS)) || exit 0

# Tests only: PyPI packages, in a venv of its own so that pip never touches Debian's Python; the venv sees
# Debian's numpy and torch (1.13) through --system-site-packages. Each is installed only when the venv cannot
# import it.
#   tensorboard   TensorBoard's own event-file reader, which integration.tensorboard reads dptrain's event files
#                 back with (Debian has no tensorboard)
#   transformers  Hugging Face's GPT2LMHeadModel.from_pretrained, which integration.hf_from_pretrained loads
#                 dptrain export-weights' folder with, and LlamaForCausalLM / Qwen2ForCausalLM, the reference of
#                 integration.llama_hf_parity; 4.45.2 is the newest that runs on Debian's torch 1.13 with Llama 3's
#                 rope scaling (tested; it brings tokenizers, safetensors and huggingface-hub)
TEST_VENV=/opt/dptrain/test-venv  # tests/integration/tensorboard.sh and hf_from_pretrained.sh name the same path
VENV_PKGS=("tensorboard tensorboard==2.21.0" "transformers transformers==4.45.2")  # "module requirement"
if [ ! -x "$TEST_VENV/bin/python" ]; then
  echo "setup: creating the test venv $TEST_VENV (tests only)"
  need_root "the test venv $TEST_VENV"
  $SUDO /usr/bin/python3 -m venv --system-site-packages "$TEST_VENV"
fi
for p in "${VENV_PKGS[@]}"; do
  read -r module requirement <<<"$p"
  # Installed when the venv lacks the pinned version (an older one is upgraded).
  if "$TEST_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('${requirement%%==*}') != '${requirement##*==}')" 2>/dev/null; then
    echo "setup: $TEST_VENV has $module ($requirement)"
  else
    echo "setup: installing PyPI $requirement into $TEST_VENV (tests only)"
    $SUDO "$TEST_VENV/bin/pip" install --quiet --disable-pip-version-check "$requirement" || {
      echo "setup: error: pip could not install $requirement into $TEST_VENV (no network or no pip index?): fix" \
        "that and run this again" >&2
      exit 1
    }
  fi
done
