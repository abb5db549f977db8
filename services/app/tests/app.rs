//! The application layer called directly, as the web console and the MCP server will:
//! no HTTP in between. Over a real SQLite log and store.

use std::sync::Arc;

use meridian_app::api::WorkflowState;
use meridian_app::read::ListQuery;
use meridian_app::workflows::Submission;
use meridian_app::{App, AppError, Principal};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_store::Store;

async fn app(dir: &tempfile::TempDir) -> App {
    let log: Arc<dyn EventLog> = Arc::new(
        SqliteLog::open(&dir.path().join("events.sqlite"))
            .await
            .unwrap(),
    );
    let store = Store::connect(&format!(
        "sqlite://{}",
        dir.path().join("store.sqlite").display()
    ))
    .await
    .unwrap();
    App::new(log, store)
}

fn submission(document: &str, key: Option<&str>) -> Submission {
    Submission {
        document: document.into(),
        declared_json: false,
        idempotency_key: key.map(str::to_string),
        traceparent: None,
    }
}

const HELLO: &str = "version: v1\nname: hello\njobs:\n  a: {image: host, command: [\"true\"]}\n";

#[tokio::test]
async fn a_caller_submits_follows_and_cancels_without_a_transport() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(&dir).await;
    let ada = Principal::trusted("physics", "ada");

    let submitted = app
        .submit(&ada, submission(HELLO, Some("k1")))
        .await
        .unwrap();
    assert!(!submitted.replayed);
    assert_eq!(submitted.accepted.state, WorkflowState::Submitted);
    let id = submitted.accepted.id;
    // The same key and document: the first submission, however much later.
    let again = app
        .submit(&ada, submission(HELLO, Some("k1")))
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.accepted.id, id);
    // The same key with another document is refused.
    let other = HELLO.replace("hello", "other");
    assert!(matches!(
        app.submit(&ada, submission(&other, Some("k1"))).await,
        Err(AppError::IdempotencyMismatch)
    ));

    // Not projected yet: the status comes from the log, with the caller's tenant.
    let status = app.status(&ada, id).await.unwrap();
    assert_eq!(status.tenant, "physics");
    assert_eq!(status.state, WorkflowState::Submitted);
    let events = app.events(&ada, id).await.unwrap();
    assert_eq!(events.events[0]["payload"]["submitted_by"], "ada");

    let cancelled = app
        .cancel(&ada, id, Some("wrong data".into()), None)
        .await
        .unwrap();
    assert_eq!(cancelled.state, WorkflowState::Cancelled);
    // A second cancel of an ended workflow is a conflict, and names why.
    let err = app.cancel(&ada, id, None, None).await.unwrap_err();
    assert!(
        matches!(&err, AppError::Conflict(m) if m.contains("cancelled")),
        "{err}"
    );
    let page = app
        .list(
            &ada,
            &ListQuery {
                limit: 10,
                ..ListQuery::default()
            },
        )
        .await
        .unwrap();
    assert!(
        page.items.is_empty(),
        "the read model has not run: nothing listed yet"
    );
}

#[tokio::test]
async fn bad_input_names_what_is_wrong_and_appends_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(&dir).await;
    let ada = Principal::trusted("physics", "ada");
    let typo = HELLO.replace("command", "comand");
    let Err(AppError::InvalidWorkflow(errors)) = app.submit(&ada, submission(&typo, None)).await
    else {
        panic!("an invalid document was accepted");
    };
    assert!(
        errors.iter().any(|e| e.path.contains("comand")),
        "{errors:?}"
    );
    let err = app.status(&ada, uuid::Uuid::now_v7()).await.unwrap_err();
    assert!(matches!(err, AppError::NotFound(_)), "{err}");
    let err = app.drain(&ada, "nowhere", None).await.unwrap_err();
    assert!(
        matches!(&err, AppError::NotFound(m) if m == "no site nowhere"),
        "{err}"
    );
    let err = app
        .apply_catalog(&ada, "sites: [{name: x}]")
        .await
        .unwrap_err();
    assert!(matches!(err, AppError::InvalidCatalog(_)), "{err}");
    assert_eq!(app.log().head().await.unwrap(), 0, "nothing was appended");
}

#[tokio::test]
async fn a_token_file_is_checked_against_this_deployment() {
    let dir = tempfile::tempdir().unwrap();
    let here = app(&dir).await;
    let issued = here.issue_first_admin("test").await.unwrap();
    assert!(here
        .knows_token(&format!("{}\n", issued.token))
        .await
        .unwrap());
    // Another deployment's token, and text that is no token at all.
    let other = tempfile::tempdir().unwrap();
    let foreign = app(&other).await.issue_first_admin("test").await.unwrap();
    assert!(!here.knows_token(&foreign.token).await.unwrap());
    assert!(!here.knows_token("not a token").await.unwrap());
}

#[tokio::test]
async fn an_audit_trail_kept_in_the_store_moves_to_its_own_database() {
    use meridian_app::audit::AuditQuery;
    let dir = tempfile::tempdir().unwrap();
    let ada = || Principal::trusted("physics", "ada");
    let trail = |app: App| async move {
        let query = AuditQuery {
            limit: 100,
            ..AuditQuery::default()
        };
        let list = app.audit_trail(&ada(), &query).await.unwrap();
        list.records
            .iter()
            .map(|r| (r.id, r.target.clone()))
            .collect::<Vec<_>>()
    };
    // An older deployment: its audit records in the store.
    let before = app(&dir).await;
    let first = before
        .submit(&ada(), submission(HELLO, None))
        .await
        .unwrap();
    let store = before.store().clone();
    assert!(store.has_table("audit_records").await.unwrap());
    let kept = trail(before.clone()).await;
    assert_eq!(kept.len(), 1, "{kept:?}");

    // Now with a database of its own: the old record moves there, the new one joins it.
    let audit_url = format!("sqlite://{}", dir.path().join("audit.sqlite").display());
    let audit = Store::connect(&audit_url).await.unwrap();
    let after = App::new(before.log().clone(), store.clone()).with_audit_store(audit.clone());
    let second = after.submit(&ada(), submission(HELLO, None)).await.unwrap();
    let moved = trail(after.clone()).await;
    assert_eq!(
        moved.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>(),
        [
            format!("workflow/{}", first.accepted.id),
            format!("workflow/{}", second.accepted.id)
        ]
    );
    assert_eq!(moved[0], kept[0], "the old record keeps its id");
    assert!(!store.has_table("audit_records").await.unwrap());

    // A move cut short after the copy, before the drop: running it again copies nothing
    // twice and still drops the store's table.
    store.migrate(&meridian_app::schema()).await.unwrap();
    let audit_file = format!("{}", dir.path().join("audit.sqlite").display());
    sqlx::query(&format!(
        "ATTACH DATABASE '{audit_file}' AS moved; INSERT INTO audit_records SELECT * FROM moved.audit_records; DETACH DATABASE moved"
    ))
    .execute(store.writer())
    .await
    .unwrap();
    let again = App::new(before.log().clone(), store.clone()).with_audit_store(audit);
    assert_eq!(trail(again).await, moved);
    assert!(!store.has_table("audit_records").await.unwrap());

    // The store's own file under another spelling of its path is not a database of its
    // own: nothing moves and nothing is dropped.
    let respelt = Store::connect(&format!("sqlite://{}/./store.sqlite", dir.path().display()))
        .await
        .unwrap();
    assert!(respelt.same_as(&store));
    let same = App::new(before.log().clone(), store.clone()).with_audit_store(respelt);
    let third = same.submit(&ada(), submission(HELLO, None)).await.unwrap();
    assert_eq!(
        trail(same).await.last().map(|(_, t)| t.clone()),
        Some(format!("workflow/{}", third.accepted.id))
    );
    assert!(store.has_table("audit_records").await.unwrap());
}
