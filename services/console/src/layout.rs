//! The page around every page (title, navigation by what the caller may do, who is
//! signed in), refusals and errors as pages, and the small formats pages share.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use meridian_app::{Action, AppError, Principal, Role};

/// A whole page.
pub(crate) fn page(title: &str, who: Option<&Principal>, body: Markup) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (title) " · Meridian" }
                    link rel="stylesheet" href="/assets/console.css";
                    script src="/assets/htmx.min.js" defer {}
                }
                body {
                    header {
                        a.brand href="/" { "Meridian" }
                        @if let Some(who) = who {
                            nav { (navigation(who)) }
                            div.who {
                                span title="who you are signed in as" {
                                    (who.user) " · " (who.role.as_str())
                                    @if who.every_tenant { " · every tenant" } @else { " · tenant " (who.tenant) }
                                }
                                form method="post" action="/sign-out" { button.link type="submit" { "Sign out" } }
                            }
                        }
                    }
                    main { (body) }
                }
            }
        }
        .into_string(),
    )
}

fn navigation(who: &Principal) -> Markup {
    html! {
        @if who.may(Action::ListWorkflows) { a href="/workflows" { "Workflows" } }
        @if who.may(Action::SubmitWorkflow) && who.role != Role::Job { a href="/workflows/new" { "Submit" } }
        @if who.may(Action::ReadSites) { a href="/sites" { "Sites" } }
        @if who.may(Action::ManageTokens) { a href="/tenants" { "Tenants" } }
        @if who.may(Action::ExportCharges) { a href="/finance" { "Finance" } }
    }
}

/// A page that says why the request was refused or failed, with its status.
pub(crate) fn refusal(status: StatusCode, who: Option<&Principal>, message: &str) -> Response {
    let title = match status {
        StatusCode::NOT_FOUND => "Not found",
        StatusCode::FORBIDDEN => "Not allowed",
        StatusCode::UNAUTHORIZED => "Not signed in",
        StatusCode::BAD_REQUEST => "Not valid",
        StatusCode::CONFLICT => "Not now",
        _ => "Something went wrong",
    };
    let body = html! {
        h1 { (title) }
        p.error role="alert" { (message) }
        @if status == StatusCode::UNAUTHORIZED { p { a href="/sign-in" { "Sign in" } } }
    };
    (status, page(title, who, body)).into_response()
}

/// An application error as a page.
pub(crate) fn failed(who: &Principal, e: AppError) -> Response {
    let status = match &e {
        AppError::InvalidWorkflow(_) | AppError::InvalidCatalog(_) | AppError::BadRequest(_) => {
            StatusCode::BAD_REQUEST
        }
        AppError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        AppError::Forbidden(_) => StatusCode::FORBIDDEN,
        AppError::NotFound(_) => StatusCode::NOT_FOUND,
        AppError::Conflict(_) | AppError::IdempotencyMismatch => StatusCode::CONFLICT,
        AppError::OverBudget(_) => StatusCode::PAYMENT_REQUIRED,
        AppError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    refusal(status, Some(who), &e.to_string())
}

/// A workflow's or run's state, as a badge its colour tells at a glance.
pub(crate) fn state(text: &str) -> Markup {
    html! { span class={ "state " (text) } { (text) } }
}

/// An exact decimal amount rounded to `places` for reading (to 6 below one, so that
/// small charges do not read as nothing); the exact figure is in the title.
pub(crate) fn amount(exact: &str, currency: &str, places: u32) -> Markup {
    let shown = match exact.parse::<rust_decimal::Decimal>() {
        Ok(d) => {
            let places = if d.abs() < rust_decimal::Decimal::ONE {
                places.max(6)
            } else {
                places
            };
            let r = d.round_dp_with_strategy(
                places,
                rust_decimal::RoundingStrategy::MidpointAwayFromZero,
            );
            format!("{r} {currency}")
        }
        Err(_) => format!("{exact} {currency}"),
    };
    html! { span.amount title={ (exact) " " (currency) } { (shown) } }
}

/// A stored time as the UTC minute and second it was, without fractions.
pub(crate) fn time(text: &str) -> Markup {
    let shown = chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| {
            t.with_timezone(&chrono::Utc)
                .format("%Y-%m-%d %H:%M:%S UTC")
                .to_string()
        })
        .unwrap_or_else(|_| text.to_string());
    html! { time datetime=(text) { (shown) } }
}

/// A form's optional `reason`, trimmed; none when blank.
pub(crate) fn reason(reason: Option<String>) -> Option<String> {
    reason
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty())
}

/// Text that is already HTML-safe (a generated SVG).
pub(crate) fn raw(svg: String) -> PreEscaped<String> {
    PreEscaped(svg)
}
