# The effective config R/config.yaml that every job reads (CONFIGFILE, workflow/rules/common.smk). It is written
# when jobs run, never while the workflow is parsed (`snakemake -n` writes nothing):
# - rule effective_config creates it when it is missing (a fresh results folder);
# - onstart brings it up to date before the first job of every run that has jobs (never in a dry run), so each job
#   reads the config of the run that started it.
# The rule has no params on purpose: a job that must run masks every job downstream of it from Snakemake's own
# rerun checks, so a rule that reran on each config edit would hide the `params: section(...)` changes of the jobs
# that read the edited section. As it is, editing a section reruns exactly the jobs that read it. (Deleting
# R/config.yaml reruns every job: it is an input of all of them.)
# The same hooks start and stop the run's job server (resources.job_server; common.smk, qerl/jobserver.py).


rule effective_config:
    output:
        CONFIGFILE,
    localrule: True
    conda:
        CONDA_ENV
    log:
        f"{R}/logs/effective_config.log",
    shell:
        "printf '%s' \"$QERL_EFFECTIVE_CONFIG\" > {output} 2> {log}"


onstart:
    write_effective_config()
    start_job_server()


onsuccess:
    stop_job_server()


onerror:
    stop_job_server()
