# Profiling at real sizes (needs a CUDA GPU; not among the default targets, whose tables read the committed
# results/measured/<gpu>/*.csv). One job measures every architecture and method of config `profile`:
#   snakemake --cores all --configfile config/paper.yaml results/paper/measured/h200/rollout.csv
# Outputs: R/measured/<gpu>/{rollout,e2e,memory}.csv (Snakemake's own: a rerun replaces them). The GRPO step it times
# is the trainer's own (qerl.rl.step.rl_step) with this config's training settings (its first GRPO task). The job appends
# rows to R/measured/<gpu>/partial/ first and copies the CSVs to its outputs only when every configuration is
# measured, so a cut job resumes where it stopped when the target is asked for again (the partial folder is not
# an output; delete it to measure from scratch). Committing a run to results/measured/<gpu>/, where the tables read
# it, is a separate step that keeps every earlier file:
#   python -m qerl.profiling.commit --src results/paper/measured/h200 --dest results/measured/h200 --tag run9


rule profile:
    input:
        config=ancient(CONFIGFILE),
    output:
        rollout=f"{paths.measured_dir(R, '{gpu}')}/rollout.csv",
        e2e=f"{paths.measured_dir(R, '{gpu}')}/e2e.csv",
        memory=f"{paths.measured_dir(R, '{gpu}')}/memory.csv",
    wildcard_constraints:
        gpu=r"[A-Za-z0-9_\-]+",
    params:
        cfg=section("profile", "train"),
        args=lambda wildcards: " ".join(
            f"--{flag} {' '.join(str(v) for v in config['profile'][key])}"
            for flag, key in (("archs", "archs"), ("methods", "methods"), ("ranks", "ranks"),
                              ("batches", "batches"), ("e2e-batches", "e2e_batches"))
        )
        + f" --prompt {config['profile']['prompt_tokens']} --completion {config['profile']['completion_tokens']}",
        work=lambda wildcards, output: os.path.join(os.path.dirname(output.rollout), "partial"),
        out=lambda wildcards, output: os.path.dirname(output.rollout),
    conda:
        CONDA_ENV
    threads: 4
    resources:
        gpu=1,
    log:
        f"{R}/logs/profile/{{gpu}}.log",
    benchmark:
        f"{R}/benchmarks/profile/{{gpu}}.tsv"
    shell:
        "qerl profile --config {input.config} {params.args} --out {params.work} --publish {params.out} 2> {log}"
