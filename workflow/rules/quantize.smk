# Quantization: AWQ calibration per 4-bit format, then the quantized checkpoint of every format in
# quantize.formats; these feed the untrained NF4 / MXFP4 / NVFP4 rows of Tables 1 and 2 and the 4-bit training runs.
# With GPUs for training (resources.train.gpus > 0) both run on a claimed GPU slot (a 7B's float32 AWQ search is
# hours on a CPU), else on the CPU.
#
#   R/quantized/<model>/awq_scales/<fmt>.safetensors   AWQ per-channel scales (nvfp4, mxfp4; when quantize.awq)
#   R/quantized/<model>/<fmt>/                         compressed-tensors checkpoint (nvfp4, mxfp4) or the NF4
#                                                      recipe (nf4), plus layer_errors.json (held-out RTN/AWQ errors)
from qerl.quantize.dag import calibration_file, calibration_inputs, quantize_inputs, quantized_dirs, scales_path

# Scheduling (Snakemake starts the ready job of highest `priority:` first, 0 when a rule gives none): calibrate and
# quantize come before every training job, whose priority is at most its number of runs (workflow/rules/train.smk).
# They are short and they unlock the 4-bit runs (QeRL's own among them, the longest job): at priority 0 they came
# after most BF16 training (measured on a 2-core Xeon: the NVFP4 calibration started 4-5 min after pretraining, and
# the 16-run QeRL job ran last, alone on one core). Threads: at the tiny scale a job is ~6 s of single-threaded
# process start-up (imports) around ~1 s of work, so with `threads: 2` everywhere the five jobs ran one after another,
# each holding both cores of a 2-core machine. `quantize` takes one thread (its ops are too small for torch to
# split: its files are the same with one thread or two), so two of them run side by side; `calibrate` keeps two,
# because its AWQ search losses (recorded in the scales file's metadata) are sums that torch does split, and their
# last bits change with the thread count. Scheduling changes no output: a job's files do not depend on when it runs.
# Snakemake's scheduler (milp) maximizes the sum of the priorities of the jobs it starts at once, so a two-thread
# `calibrate` at QUANTIZE_PRIORITY lost to a one-thread `quantize` (nf4) plus a training job started beside it:
# measured on the 2-core Xeon, the calibrations waited until 243 s (pretraining ended at 115 s) and the 16-run QeRL
# job started at 249 s and ended the DAG at 462 s. CALIBRATE_PRIORITY outweighs any such pair (a training job's
# priority is at most len(train_runs())), and a pair of quantize jobs, so both calibrations run first.
QUANTIZE_PRIORITY = len(train_runs()) + 1
CALIBRATE_PRIORITY = 2 * QUANTIZE_PRIORITY + 1


rule calibrate:
    input:
        unpack(lambda wildcards: calibration_inputs(config, R)),
        config=ancient(CONFIGFILE),
        base=paths.base_model_dir(R, "{model}"),
    output:
        scales_path(R, "{model}", "{fmt}"),
    wildcard_constraints:
        fmt="nvfp4|mxfp4",
    params:
        cfg=section("quantize", "data", "model"),
        data=calibration_file(config),
    conda:
        CONDA_ENV
    threads: 2  # capped at --cores by Snakemake; see above
    priority: CALIBRATE_PRIORITY  # before the training jobs it unlocks, and before a quantize + train pair
    resources:
        gpu=1 if config["resources"]["train"]["gpus"] else 0,
    log:
        f"{R}/logs/calibrate/{{model}}/{{fmt}}.log",
    benchmark:
        f"{R}/benchmarks/calibrate/{{model}}/{{fmt}}.tsv"
    shell:
        gpu_command("calibrate") + " --config {input.config} --base {input.base} --format {wildcards.fmt} "
        "--calib {params.data} --out {output} 2> {log}"


rule quantize:
    input:
        unpack(lambda wildcards: quantize_inputs(config, R, ancient(CONFIGFILE), wildcards.model, wildcards.fmt)),
    output:
        directory(paths.quantized_dir(R, "{model}", "{fmt}")),
    wildcard_constraints:
        fmt="nvfp4|mxfp4|nf4",
    params:
        cfg=section("quantize", "data", "model"),
        data=calibration_file(config),
        scales=lambda wildcards, input: f"--scales {input.scales}" if "scales" in input.keys() else "",
    conda:
        CONDA_ENV
    threads: 1  # see above
    priority: QUANTIZE_PRIORITY  # before the training jobs it unlocks
    resources:
        gpu=1 if config["resources"]["train"]["gpus"] else 0,
    log:
        f"{R}/logs/quantize/{{model}}/{{fmt}}.log",
    benchmark:
        f"{R}/benchmarks/quantize/{{model}}/{{fmt}}.tsv"
    shell:
        gpu_command("quantize") + " --config {input.config} --base {input.base} --format {wildcards.fmt} "
        "--calib {params.data} {params.scales} --out {output} 2> {log}"


rule quantize_all:
    input:
        quantized_dirs(config, R, MODEL),
