//! What the site runner's tests share.

use std::collections::BTreeMap;

use meridian_eventlog::aggregates::execute;
use meridian_eventlog::EventLog;
use meridian_events::aggregate::{Site, SiteCommand};
use meridian_events::{EventContext, SiteKind};
use uuid::Uuid;

/// Registers a local site `name` without prices; its aggregate id.
pub async fn register(log: &dyn EventLog, name: &str) -> Uuid {
    let site_id = Uuid::now_v7();
    execute::<Site, _>(log, site_id, &EventContext::new_chain("t"), |_| {
        SiteCommand::Register {
            name: name.into(),
            kind: SiteKind::Local,
            region: "r".into(),
            jurisdiction: "eu".into(),
            credentials_secret: None,
            labels: BTreeMap::new(),
            prices: None,
        }
    })
    .await
    .unwrap();
    site_id
}
