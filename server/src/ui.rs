//! The web view `drivetrain serve` and `drivetrain ui` answer at `/`: one page of plain
//! HTML, CSS and JavaScript modules in `server/src/ui/`, compiled into the binary (no
//! build step, no dependency; graphs come laid out from the API, `api/layout.rs`).
//! Everything it shows it reads from the API under `/api/v1`, with the same
//! token rules as any client: the page sends the token a person typed in (kept for the
//! browser tab only), so a server with a token shows nothing to a page without it.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("ui/index.html");
const STYLE: &str = include_str!("ui/app.css");
/// The page's JavaScript modules, by file name: `app.js` imports the others.
const MODULES: [(&str, &str); 7] = [
    ("app.js", include_str!("ui/app.js")),
    ("dom.js", include_str!("ui/dom.js")),
    ("graph.js", include_str!("ui/graph.js")),
    ("timeline.js", include_str!("ui/timeline.js")),
    ("charts.js", include_str!("ui/charts.js")),
    ("trials.js", include_str!("ui/trials.js")),
    ("compare.js", include_str!("ui/compare.js")),
];

/// The page may load its own script and style and talk to its own server, nothing else;
/// no other site may frame it.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                      form-action 'none'; frame-ancestors 'none'";

fn asset(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `/`, `/ui/app.css` and `/ui/NAME.js` for each module.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let mut router = Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        );
    for (name, body) in MODULES {
        router = router.route(
            &format!("/ui/{name}"),
            get(move || async move { asset("text/javascript; charset=utf-8", body) }),
        );
    }
    router
}
