//! The submit lock: "is it there already? if not, submit it" must happen once at a time
//! for a Meridian job, across adapter instances and processes, or two racing submits
//! would both find nothing and both submit. Batch schedulers (Slurm, PBS) have no
//! unique-name constraint to lean on, so their adapters take an exclusive lock on a
//! local file (`flock(2)` through `File::try_lock`) around find-then-submit.
//!
//! The locks are striped: a job's id picks one of [`STRIPES`] files. The files are never
//! deleted (deleting a lock file someone waits on lets two holders in), so their number
//! stays fixed however many jobs run.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;
use std::time::Duration;

use uuid::Uuid;

pub const STRIPES: u32 = 64;

/// Held while it lives; dropping the file releases the lock.
#[derive(Debug)]
pub struct SubmitLock {
    _file: File,
}

impl SubmitLock {
    /// Waits (polling, so no runtime thread blocks) until this job's stripe is free.
    pub async fn acquire(dir: &Path, job_id: Uuid) -> std::io::Result<SubmitLock> {
        std::fs::create_dir_all(dir)?;
        let stripe = (job_id.as_u128() % u128::from(STRIPES)) as u32;
        let path = dir.join(format!("submit-{stripe:02}.lock"));
        // A fresh open file description each time: flock conflicts between two of them
        // even in one process, which is what keeps two adapter instances apart.
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(SubmitLock { _file: file }),
                Err(TryLockError::WouldBlock) => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                Err(TryLockError::Error(e)) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn one_holder_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let job = Uuid::now_v7();
        let inside = Arc::new(AtomicU32::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (dir, inside) = (dir.path().to_path_buf(), inside.clone());
            tasks.push(tokio::spawn(async move {
                let _lock = SubmitLock::acquire(&dir, job).await.unwrap();
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                tokio::time::sleep(Duration::from_millis(20)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(std::fs::read_dir(dir.path()).unwrap().count() <= STRIPES as usize);
    }
}
