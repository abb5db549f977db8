//! sbatch scripts that cannot be imported: each error names the line and the directive,
//! every error is reported at once, and the script that runs is checked by running it.

use std::path::Path;
use std::process::Command;

use meridian_import::{import, Format};

fn errors(script: &str) -> Vec<String> {
    match import(Format::Sbatch, script, "job.sh") {
        Ok(_) => panic!("imported:\n{script}"),
        Err(e) => e.0.iter().map(|e| format!("job.sh:{e}")).collect(),
    }
}

#[test]
fn an_unknown_gpu_type_names_its_line_and_directive() {
    let got = errors(
        "#!/bin/bash\n#SBATCH --time=10\n#SBATCH --mem=1G\n#SBATCH --gres=gpu:a10o:2\nrun\n",
    );
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("job.sh:4: --gres=gpu:a10o:2: unknown GPU type \"a10o\""),
        "{got:?}"
    );
}

#[test]
fn every_bad_directive_is_reported_together() {
    let got = errors(
        "#!/bin/bash\n\
         #SBATCH --time=1h\n\
         #SBATCH --dependency=afterok:1234\n\
         #SBATCH --memory=4G\n\
         #SBATCH --chdir=relative/dir\n\
         #SBATCH -t\n\
         #SBATCH --array=9-1\n\
         #SBATCH --job-name='open\n\
         #SBATCH --mem=0\n\
         #SBATCH hetjob\n\
         run\n",
    );
    let expected = [
        "job.sh:2: --time=1h: expected a time limit",
        "job.sh:3: --dependency=afterok:1234: meridian import takes one script",
        "job.sh:4: --memory=4G: --memory is not an sbatch option",
        "job.sh:5: --chdir=relative/dir: expected an absolute path",
        "job.sh:6: -t: -t needs a value",
        "job.sh:7: --array=9-1: the range 9-1 ends before it starts",
        "job.sh:8: --job-name='open: a single quote is not closed",
        "job.sh:9: --mem=0: \"0\" asks Slurm for all of a node's memory",
        "job.sh:10: #SBATCH hetjob: heterogeneous jobs are not supported",
    ];
    assert_eq!(got.len(), expected.len(), "{got:#?}");
    let mut got = got;
    got.sort_by_key(|e| e.split(':').nth(1).unwrap().parse::<u32>().unwrap());
    for (got, expected) in got.iter().zip(expected) {
        assert!(got.starts_with(expected), "{got}\n  expected: {expected}…");
    }
}

#[test]
fn a_script_without_its_interpreter_line_is_refused() {
    let got = errors("#SBATCH --time=10\necho hi\n");
    assert!(
        got[0].starts_with("job.sh:1: a batch script starts with #!"),
        "{got:?}"
    );
}

#[test]
fn asking_for_gpus_or_memory_twice_is_refused() {
    let got = errors("#!/bin/sh\n#SBATCH --gres=gpu:2\n#SBATCH --gpus-per-node=2\ntrue\n");
    assert!(
        got[0]
            .starts_with("job.sh:3: --gpus-per-node=2: GPUs are asked for already (--gres=gpu:2)"),
        "{got:?}"
    );
    let got = errors("#!/bin/sh\n#SBATCH --mem=2G\n#SBATCH --mem-per-cpu=1G\ntrue\n");
    assert!(
        got[0].starts_with("job.sh:3: --mem-per-cpu=1G: memory is asked for already"),
        "{got:?}"
    );
    // Both contradictions at once.
    let got = errors(
        "#!/bin/sh\n#SBATCH --gres=gpu:2 --mem=1G\n#SBATCH --gpus=2\n#SBATCH --mem-per-gpu=4G\ntrue\n",
    );
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got[0].starts_with("job.sh:3: --gpus=2: GPUs are asked for already"),
        "{got:?}"
    );
    assert!(
        got[1].starts_with("job.sh:4: --mem-per-gpu=4G: memory is asked for already"),
        "{got:?}"
    );
    let got = errors("#!/bin/sh\n#SBATCH --nodes=2\n#SBATCH --gpus=3\ntrue\n");
    assert!(
        got[0].contains("3 GPUs do not divide evenly over 2 nodes"),
        "{got:?}"
    );
}

/// A directory holding only the tools the script needs, so no srun or module of this
/// machine's is found: the prelude's own stand in.
fn bare_path() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for tool in [
        "mktemp", "cat", "rm", "chmod", "cp", "echo", "printf", "bash",
    ] {
        let found = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} is not installed"));
        std::os::unix::fs::symlink(found, dir.path().join(tool)).unwrap();
    }
    dir
}

#[test]
fn the_imported_script_runs_with_slurms_variables_and_without_slurm() {
    let script = "#!/bin/bash\n\
        #SBATCH --job-name=sweep\n\
        #SBATCH --array=0,3,7-9%2\n\
        #SBATCH --ntasks=4\n\
        #SBATCH --time=5\n\
        module load python/3.11\n\
        echo \"id=$SLURM_ARRAY_TASK_ID count=$SLURM_ARRAY_TASK_COUNT job=$SLURM_JOB_ID name=$SLURM_JOB_NAME ntasks=$SLURM_NTASKS\"\n\
        srun --mpi=pmix -n 4 --exclusive echo \"from srun: $((SLURM_ARRAY_TASK_ID * 2))\"\n\
        exit 3\n";
    let imported = import(Format::Sbatch, script, "job.sh").unwrap();
    let job = &imported.workflow.jobs["sweep"];
    let array = job.array.unwrap();
    assert_eq!((array.start, array.end, array.parallelism), (0, 4, 2));
    let path = bare_path();
    // Task 3 of 0..=4 is index 8 of the script's array.
    let out = Command::new(&job.command[0])
        .args(&job.command[1..])
        .env_clear()
        .env("PATH", path.path())
        .env("MERIDIAN_JOB_ID", "0190b6a4-4c1e-7cc3-9a52-4d3f0b1f2e9a")
        .env("ARRAY_INDEX", "3")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "the script's exit code: {stdout}{stderr}"
    );
    assert_eq!(
        stdout,
        "id=8 count=5 job=0190b6a4-4c1e-7cc3-9a52-4d3f0b1f2e9a name=sweep ntasks=4\nfrom srun: 16\n"
    );
    assert!(
        stderr.contains("no environment modules at this site; skipped: module load python/3.11"),
        "{stderr}"
    );
}

#[test]
fn numbers_too_large_are_errors_naming_the_directive() {
    for (directive, expected) in [
        ("-c 4000000000 -n 2", "more than Meridian counts"),
        ("--time=99999999999999999-00", "longer than Meridian counts"),
        (
            "--mem=99999999999999999T",
            "more memory than Meridian counts",
        ),
        ("--array=0-4294967295", "more than 1000000 tasks"),
        (
            "--gres=gpu:a100_99999999999999999gb:1",
            "more memory than any GPU has",
        ),
    ] {
        let got = errors(&format!("#!/bin/sh\n#SBATCH {directive}\ntrue\n"));
        assert!(
            got.iter().any(|e| e.contains(expected)),
            "{directive}: {got:?}"
        );
    }
    // A late --gres replaces an earlier one, as in sbatch.
    let imported = import(
        Format::Sbatch,
        "#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --gres=gpu:h100:4\ntrue\n",
        "job.sh",
    )
    .unwrap();
    let gpus = imported.workflow.jobs["job"]
        .resources
        .gpus
        .clone()
        .unwrap();
    assert_eq!((gpus.count, gpus.model.as_deref()), (4, Some("H100")));
}
