//! The JetStream backend against the conformance suite on its production shape: a
//! three-server cluster (`infra/nats/cluster.conf`, run three times on loopback), each
//! check on a new stream at R3. Followers answer direct reads and pull requests cross
//! routes here, which one server never shows: a history read from a replica that has not
//! caught up, a commit delivered into a pull request its reader gave up on.

use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use meridian_eventlog::conformance::Open;
use meridian_eventlog::nats::{NatsConfig, NatsLog};
use meridian_eventlog::testkit::NatsCluster;
use meridian_eventlog::EventLog;

/// One cluster shared by the checks running at the same time (each on its own stream):
/// three servers per check would be dozens of servers on a small machine. The last check
/// to let go of it stops it.
fn cluster() -> Arc<NatsCluster> {
    static SHARED: Mutex<Weak<NatsCluster>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap();
    if let Some(cluster) = shared.upgrade() {
        return cluster;
    }
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/nats/cluster.conf");
    let cluster = Arc::new(NatsCluster::start(&config, 3).expect("a nats-server 2.10+ cluster"));
    *shared = Arc::downgrade(&cluster);
    cluster
}

fn fresh() -> Open {
    let cluster = cluster();
    let unique = uuid::Uuid::now_v7().simple().to_string();
    let config = NatsConfig {
        url: cluster.urls(),
        stream: format!("CONFORMANCE_{unique}"),
        subject_prefix: format!("conformance.{unique}"),
        replicas: 3,
        ack_wait: Duration::from_secs(30),
        ..NatsConfig::default()
    };
    Arc::new(move || {
        let (config, _keep_alive) = (config.clone(), cluster.clone());
        Box::pin(async move {
            // Fifteen checks making R3 streams at once on two cores can outlast a
            // stream creation's request timeout; the services retry a start the same way
            // (docs/running.md).
            let mut tries = 0;
            let log = loop {
                match NatsLog::connect(config.clone()).await {
                    Ok(log) => break log,
                    Err(e) if e.is_transient() && tries < 4 => {
                        tries += 1;
                        eprintln!("connecting to the cluster, try {tries}: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(e) => panic!("connect to the cluster: {e}"),
                }
            };
            Arc::new(log) as Arc<dyn EventLog>
        })
    })
}

meridian_eventlog::conformance_suite!(fresh());
