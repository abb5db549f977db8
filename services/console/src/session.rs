//! Signing in and out: the API token a browser signs in with is kept in an HTTP-only,
//! same-site cookie and checked by the application on every request, so revoking the
//! token ends the session at once. Nothing about the session is kept on the server.

use axum::extract::rejection::FormRejection;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use maud::html;
use meridian_app::{AppError, Credentials, Principal, Role};
use serde::Deserialize;

use crate::layout::{self, page};
use crate::{Client, Console};

/// The cookie that holds the signed-in token.
pub const COOKIE: &str = "meridian_token";

/// The token in the request's sign-in cookie, if there is one.
fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn credentials(request: &Request, token: String) -> Credentials {
    Credentials {
        bearer: Some(token),
        tenant: None,
        user: None,
        source: request
            .extensions()
            .get::<Client>()
            .and_then(|c| c.address.clone()),
        request: format!("{} {}", request.method(), request.uri().path()),
    }
}

/// Every page but sign-in: the caller from the cookie, or to the sign-in page (a read)
/// or a 401 (a form) when there is none that holds.
pub(crate) async fn signed_in(
    State(console): State<Console>,
    mut request: Request,
    next: Next,
) -> Response {
    let found = match cookie_token(request.headers()) {
        Some(token) => {
            let credentials = credentials(&request, token);
            console
                .app
                .authenticate(&credentials)
                .await
                .ok()
                .filter(|who| who.role != Role::Job)
        }
        None => None,
    };
    match found {
        Some(who) => {
            request.extensions_mut().insert(who);
            next.run(request).await
        }
        // A page's refresh (htmx) cannot follow a redirect into its own part: it is
        // told to load the sign-in page instead.
        None if request.headers().contains_key("hx-request") => {
            let mut response = StatusCode::UNAUTHORIZED.into_response();
            response
                .headers_mut()
                .insert("hx-redirect", HeaderValue::from_static("/sign-in"));
            response
        }
        None if request.method() == axum::http::Method::GET => {
            let next = request
                .uri()
                .path_and_query()
                .map(|p| p.as_str().to_string())
                .unwrap_or_else(|| "/".into());
            Redirect::to(&format!("/sign-in?next={}", encode(&next))).into_response()
        }
        None => layout::refusal(
            StatusCode::UNAUTHORIZED,
            None,
            "You are not signed in, or your token was revoked: sign in again.",
        ),
    }
}

/// `/`: the caller's home page, or the sign-in page.
pub(crate) async fn home(State(console): State<Console>, request: Request) -> Response {
    let Some(token) = cookie_token(request.headers()) else {
        return Redirect::to("/sign-in").into_response();
    };
    let credentials = credentials(&request, token);
    match console.app.authenticate(&credentials).await {
        Ok(who) => Redirect::to(home_of(&who)).into_response(),
        Err(_) => Redirect::to("/sign-in").into_response(),
    }
}

/// Where a caller starts: finance at the month's bills, everyone else at workflows.
fn home_of(who: &Principal) -> &'static str {
    match who.role {
        Role::Finance => "/finance",
        _ => "/workflows",
    }
}

#[derive(Deserialize)]
pub(crate) struct Next_ {
    next: Option<String>,
}

pub(crate) async fn sign_in_form(Query(q): Query<Next_>) -> Response {
    sign_in_page(StatusCode::OK, q.next.as_deref(), None)
}

fn sign_in_page(status: StatusCode, next: Option<&str>, error: Option<&str>) -> Response {
    let body = html! {
        h1 { "Sign in" }
        p { "Paste an API token. " code { "meridian up" } " issued an admin token into the CLI's profile; "
            code { "meridian console" } " prints it with this page's address. An admin issues others with "
            code { "meridian admin token create" } "." }
        @if let Some(e) = error { p.error role="alert" { (e) } }
        form method="post" action="/sign-in" {
            label for="token" { "Token" }
            input #token type="password" name="token" autocomplete="off" required autofocus;
            @if let Some(n) = next { input type="hidden" name="next" value=(n); }
            button type="submit" { "Sign in" }
        }
    };
    (status, page("Sign in", None, body)).into_response()
}

#[derive(Deserialize)]
pub(crate) struct SignIn {
    token: String,
    next: Option<String>,
}

pub(crate) async fn sign_in(
    State(console): State<Console>,
    client: Option<Extension<Client>>,
    form: Result<Form<SignIn>, FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return sign_in_page(
            StatusCode::BAD_REQUEST,
            None,
            Some("token: expected the token's text."),
        );
    };
    let token = form.token.trim().to_string();
    let next = form.next.filter(|n| local_path(n));
    if token.is_empty() {
        return sign_in_page(
            StatusCode::BAD_REQUEST,
            next.as_deref(),
            Some("token: paste a token to sign in."),
        );
    }
    let client = client.map(|Extension(c)| c).unwrap_or_default();
    let credentials = Credentials {
        bearer: Some(token.clone()),
        source: client.address.clone(),
        request: "POST /sign-in".into(),
        ..Credentials::default()
    };
    match console.app.authenticate(&credentials).await {
        Ok(who) if who.role == Role::Job => sign_in_page(
            StatusCode::FORBIDDEN,
            next.as_deref(),
            Some("A workflow's own credential does not sign in to the console; use an API token."),
        ),
        Ok(who) => {
            let to = next.unwrap_or_else(|| home_of(&who).to_string());
            let mut response = Redirect::to(&to).into_response();
            // A token is printable ASCII without ';' or spaces; anything else is refused
            // above by authentication.
            let secure = if client.secure { "; Secure" } else { "" };
            if let Ok(value) = HeaderValue::from_str(&format!(
                "{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/{secure}"
            )) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
        }
        Err(AppError::Unavailable(e)) => {
            sign_in_page(StatusCode::SERVICE_UNAVAILABLE, next.as_deref(), Some(&e))
        }
        Err(e) => sign_in_page(
            StatusCode::UNAUTHORIZED,
            next.as_deref(),
            Some(&format!("That token does not sign in: {e}")),
        ),
    }
}

pub(crate) async fn sign_out() -> Response {
    let mut response = Redirect::to("/sign-in").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("meridian_token=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    response
}

/// A path on this server, for redirects after sign-in: printable ASCII without spaces
/// or backslashes (browsers drop tabs and newlines, so `/\t/evil` would become
/// `//evil`), starting with one `/`.
fn local_path(p: &str) -> bool {
    p.starts_with('/')
        && !p.starts_with("//")
        && p.bytes().all(|b| (0x21..0x7f).contains(&b) && b != b'\\')
}

fn encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::local_path;

    #[test]
    fn only_this_servers_paths_are_followed_after_sign_in() {
        assert!(local_path("/workflows?state=running"));
        for elsewhere in [
            "//evil.example",
            "/\t/evil.example",
            "/\\evil.example",
            "https://evil.example",
            "/a b",
            "/\n/x",
            "",
            "workflows",
        ] {
            assert!(!local_path(elsewhere), "{elsewhere:?}");
        }
    }
}
