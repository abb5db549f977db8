//! What a UUIDv7 costs, the id of every event, workflow and job: the router makes
//! several for each workflow it places.
//!
//! `cargo bench -p meridian-events --bench ids`
//!
//! With uuid's `fast-rng` feature (the workspace's) the random bits come from a
//! thread-local generator seeded by the OS; without it, each id is a `getrandom`
//! system call.

fn main() {
    let ids = 1_000_000u32;
    let mut fold = 0u128;
    let start = std::time::Instant::now();
    for _ in 0..ids {
        fold ^= std::hint::black_box(uuid::Uuid::now_v7()).as_u128();
    }
    let elapsed = start.elapsed();
    println!(
        "| Uuid::now_v7 | {ids} ids | {:.0} ns an id | (fold {:x}) |",
        elapsed.as_nanos() as f64 / f64::from(ids),
        fold & 0xff
    );
}
