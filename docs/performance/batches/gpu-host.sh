#!/bin/bash
# The batch study (batch_study.py) on a GPU host with no network (a harness, not part of the product).
# The study's workload is the embedded default on the stand-in engine (PyTorch on the CPU), as on the
# development machine, so the host's cores are what the front, Triton, the stand-in and the client share;
# nvidia-smi is hidden so that the plan is the same embedded default and not a TensorRT-LLM engine.
#   carry DEST     (development machine) copy into DEST (the sent checkout's ignored .carry/batches): this
#                  script, batch_study.py, this checkout's packages/ (xz) and, as site.tar.xz, what the carried
#                  site-packages (site312 parts) lack for the embedded model: python-multipart, peft and
#                  accelerate (pure Python, the lock's versions) and transformers' bloom and encoder_decoder
#                  (peft and AutoTokenizer import them; the archive keeps only auto and llama); with
#                  SITE=archive also a one-piece site-packages archive
#   setup          (call 1 of 2, carrying .carry/site312.part-aa and .carry/batches) keep part aa under /tmp
#   mifN           (call 2..) the study at runtime.batches.max_in_flight N, side by side with and without
#                  a batch in one run; the stand-in's device as the deployment's default (auto: cuda where
#                  torch sees a GPU); several steps run one after another on the same machine
#   cpu-mifN       the same with runtime.pytorch.device cpu (the development machine's compute path)
# Usage, from the repository root: bash gpu-host.sh STEP...  LOCAL=1: this checkout's .venv, small loads.
set -u
T0=$(date +%s); BUDGET_S=${BUDGET_S:-570}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; RES=${RES:-/tmp/res-batches}; mkdir -p $RES
STUDY=docs/performance/batches; CARRY=.carry/batches
V=${VENV:-/tmp/vb}  # its own venv: the fleet study's (/tmp/v) on the same warm machine sees the whole image site
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
pack() { tar -czf $OUT/results.tmp -C $RES . 2>/dev/null && mv $OUT/results.tmp $OUT/results.tgz; }
if [ "${1:-}" = carry ]; then
  DEST=$2; rm -rf "$DEST" /tmp/batches-site && mkdir -p "$DEST" /tmp/batches-site/transformers/models
  cp $STUDY/gpu-host.sh $STUDY/batch_study.py "$DEST/"
  tar -C . -cf - --exclude __pycache__ packages | xz -T2 -6 > "$DEST/packages.tar.xz"
  [ -n "${SITE:-}" ] && cp "$SITE" "$DEST/site312.tar.xz"
  SRC312=${SRC312:-/work/main/.venv-py3.12/lib/python3.12/site-packages}
  SRC311=${SRC311:-$PWD/.venv/lib/python3.11/site-packages}
  cp -a $SRC312/multipart $SRC312/python_multipart $SRC312/python_multipart-0.0.34.dist-info /tmp/batches-site/
  cp -a $SRC311/peft $SRC311/peft-0.21.2.dist-info $SRC311/accelerate $SRC311/accelerate-1.15.0.dist-info /tmp/batches-site/
  cp -a $SRC312/transformers/models/bloom $SRC312/transformers/models/encoder_decoder /tmp/batches-site/transformers/models/
  find /tmp/batches-site -name __pycache__ -prune -exec rm -rf {} +
  tar -C /tmp/batches-site -cf - . | xz -T2 -6 > "$DEST/site.tar.xz"
  du -sh "$DEST"; exit
fi
if [ -z "${LOCAL:-}" ]; then
  if [ "${1:-}" = setup ]; then cp .carry/site312.part-aa /tmp/ && log "setup: part aa kept"; exit; fi
  log "host: $(nproc) cores, $(python3 -V 2>&1); $(nvidia-smi -L 2>/dev/null | head -1)"
  log "cpu: $(lscpu 2>/dev/null | grep -E '^Model name' | tr -s ' ')"
  PY=$(command -v python3)
  if [ ! -x $V/bin/python ]; then
    $PY -m venv --without-pip $V || { log "venv failed"; exit 1; }
    SP=$($V/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    IMG=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if [ -f $CARRY/site312.tar.xz ]; then tar -xJf $CARRY/site312.tar.xz -C "$SP" || { log "site extract failed"; exit 1; }
    else AB=.carry/site312.part-ab; [ -f $AB ] || AB=/tmp/site312.part-ab  # carried now, or kept by an earlier call
         cat /tmp/site312.part-aa $AB | tar -xJ -C "$SP" || { log "site extract failed"; exit 1; }; fi
    tar -xJf $CARRY/site.tar.xz -C "$SP" || { log "extras extract failed"; exit 1; }
    # From the image only torch (with what it imports) and tokenizers, after ours: the image's other packages
    # are built for numpy 2 (scipy uses np.long, which numpy 1.26 lacks) and Triton 2.51's python backend
    # stub needs numpy < 2, so the carried numpy 1.26 stays and the rest of the image stays out of sight.
    mkdir -p /tmp/img
    for p in torch torch-* torchgen functorch nvidia nvidia_* triton triton-* cuda cuda_* cuda-* sympy sympy-* \
             networkx networkx-* mpmath mpmath-* tokenizers tokenizers-*; do
      for f in "$IMG"/$p; do [ -e "$f" ] && ln -sfn "$f" /tmp/img/; done
    done
    echo "import site; site.addsitedir('/tmp/img')" > "$SP/zz_image_site.pth"
    # The package and the study as committed on the study's branch (the device gets another checkout's tree).
    mkdir -p /tmp/pkg && tar -xJf $CARRY/packages.tar.xz -C /tmp/pkg && echo /tmp/pkg/packages > "$SP/trtllm_truss_src.pth"
    log "site ready: $(du -sh $SP | cut -f1)"
  fi
  cp $CARRY/batch_study.py $STUDY/batch_study.py
  export PATH=$V/bin:$PATH; PYRUN=python
  REAL_SMI=$(command -v nvidia-smi)
  mkdir -p /tmp/nogpu && printf '#!/bin/sh\nexit 1\n' > /tmp/nogpu/nvidia-smi && chmod +x /tmp/nogpu/nvidia-smi
  export PATH=/tmp/nogpu:$PATH
  SIZE=()
else
  PYRUN=$PWD/.venv/bin/python; export PATH=$PWD/.venv/bin:$PATH
  SIZE=(--lines 40 --rounds 1 --streams 4 --per-stream 1)
fi
export PYTHONUNBUFFERED=1
$PYRUN -c "import torch, transformers, tokenizers, numpy, multipart, peft, trtllm_truss.fronts.direct_app as d; from transformers import AutoTokenizer, LlamaForCausalLM; print('imports ok: torch', torch.__version__, 'transformers', transformers.__version__, 'numpy', numpy.__version__, 'package at', d.__file__)" || { log "imports failed"; exit 1; }
C=$(nproc)
CUDA=$($PYRUN -c "import torch; print('gpu' if torch.cuda.is_available() else 'cpu')")
# Which processes hold the GPU while the studies run (the stand-in's stub does where its device is cuda).
[ -n "${REAL_SMI:-}" ] && { $REAL_SMI --query-compute-apps=pid,process_name,used_memory --format=csv -l 5 > $RES/${C}core-gpu-apps.log 2>&1 & }
for s in "$@"; do case $s in
  mif*|cpu-mif*) n=${s#*mif}; left=$(( BUDGET_S - ($(date +%s) - T0) ))
        [ $left -lt ${MIN_LEFT_S:-200} ] && { log "SKIP $s (${left}s left)"; continue; }
        if [ ${s%%-*} = cpu ]; then dev=cpu; export TRTLLM_RUNTIME__PYTORCH__DEVICE=cpu; else dev=$CUDA; unset TRTLLM_RUNTIME__PYTORCH__DEVICE; fi
        name=${C}core-$dev-max-in-flight-$n; log "START $name"
        timeout $(( left - 10 )) $PYRUN $STUDY/batch_study.py --max-in-flight $n "${SIZE[@]}" ${STUDY_ARGS:-} --out $RES/$name.json \
          --work-dir /tmp/work-$dev-$n > $RES/$name-study.log 2>&1
        log "$name rc=$?"
        for f in /tmp/work-$dev-$n/direct-*.log; do [ -f $f ] && tail -c 200000 $f > $RES/$name-$(basename $f); done
        $PYRUN - $RES/$name.json <<'EOF' || tail -20 $RES/$name-study.log
import json, sys
r = json.load(open(sys.argv[1]))
for p in r["phases"]:
    print(f"  batch={p['batch']!s:5} p50 {p['p50_ms']:7.1f} ms  p90 {p['p90_ms']:7.1f} ms  wall {p['wall_s']:5.1f} s"
          + (f"  lines during {p['batch_lines_answered_during']} ({p['batch_lines_per_s_during']:.1f}/s)" if p["batch"] else ""))
print("  ratios per round", [round(x, 2) for x in r["ttft_p50_ratio_per_round"]], "pooled",
      round(r["ttft_p50_ratio_pooled"], 3), f"({r['pooled_without']['p50_ms']:.1f} -> {r['pooled_with']['p50_ms']:.1f} ms)")
print("  batch lines/s beside interactive", round(r["batch_lines_per_s_beside_interactive"], 2),
      "load", r["load_average_at_start"], r["load_average_at_end"])
if "batch" in r:
    print("  alone", round(r["batch_lines_per_s_alone"], 2), "batch_s", round(r["batch_s"], 1), "batch", r["batch"])
EOF
        pack ;;
  *) log "unknown step $s";;
esac; done
pack; log "all done"
