# Profiling at real sizes (needs a CUDA GPU; not among the default targets, whose tables read the committed
# results/measured/<gpu>/*.csv). One job measures every architecture and method of config `profile` into
# results/measured/<gpu>/ (appending; a configuration already in the files is skipped, so a cut run resumes):
#   snakemake --cores all --forcerun profile results/measured/h200/rollout.csv
MEASURED = f"{config['results_dir']}/measured"  # where the report reads them (qerl.report.context.measured_dir)


rule profile:
    input:
        config=ancient(CONFIGFILE),
    output:
        rollout=f"{MEASURED}/{{gpu}}/rollout.csv",
        e2e=f"{MEASURED}/{{gpu}}/e2e.csv",
        memory=f"{MEASURED}/{{gpu}}/memory.csv",
    wildcard_constraints:
        gpu=r"[A-Za-z0-9_\-]+",
    params:
        cfg=section("profile"),
        args=lambda wildcards: " ".join(
            f"--{flag} {','.join(str(v) for v in config['profile'][key])}"
            for flag, key in (("archs", "archs"), ("methods", "methods"), ("ranks", "ranks"),
                              ("batches", "batches"), ("e2e-batches", "e2e_batches"))
        )
        + f" --prompt {config['profile']['prompt_tokens']} --completion {config['profile']['completion_tokens']}",
        out=lambda wildcards, output: os.path.dirname(output.rollout),
    conda:
        CONDA_ENV
    threads: 4
    resources:
        gpu=1,
    log:
        f"{MEASURED}/{{gpu}}/profile.log",
    shell:
        "qerl profile {params.args} --out {params.out} 2> {log}"
