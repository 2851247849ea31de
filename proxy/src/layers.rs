//! The concerns that wrap a whole request, as tower layers, in the order a request meets
//! them (stacked by `crate::server::whole_request`):
//!
//! 1. its ids ([`crate::request_id::AssignIds`]): every response, the refusals of the
//!    layers below included, carries the `X-Request-Id` the request was given;
//! 2. its outcome ([`crate::telemetry::outcomes::CountOutcomes`]): counted once in
//!    `meridian_requests_total`, when the response has ended or the client left;
//! 3. the size of its head ([`crate::head_limit::LimitHead`], `server.max_header_bytes`);
//! 4. the size of its body ([`crate::body_limit::LimitBody`], `server.max_body_bytes`).
//!
//! Each concern is a [`Concern`]: what it does around the rest of the stack, written as
//! one async step that may answer by itself or hand the request on. [`Wrap`] makes it a
//! [`tower::Layer`], so the stack is a [`tower::ServiceBuilder`] the router takes whole,
//! and each concern can be driven alone with any inner service (the tests below). This
//! module knows no concern: each imports it, and the server stacks them.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::Response;
use tower::{Layer, Service};

/// What a [`Concern`] hands back: the response, once the rest of the stack (or the
/// concern itself) has one. Boxed once per concern and request, as axum's own
/// middleware does; nothing here runs per streamed chunk.
pub type Responding = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// The rest of the stack below a concern: ready to take the request (tower's contract:
/// the service polled ready is the one called).
pub trait Next:
    Service<Request, Response = Response, Error = Infallible, Future: Send + 'static> + Send + 'static
{
}

impl<S> Next for S where
    S: Service<Request, Response = Response, Error = Infallible, Future: Send + 'static> + Send + 'static
{
}

/// One whole-request concern: what it does with a request and the rest of the stack.
pub trait Concern: Clone + Send + Sync + 'static {
    fn around<S: Next>(&self, req: Request, next: S) -> Responding;
}

/// A [`Concern`] as a [`tower::Layer`].
#[derive(Clone, Debug)]
pub struct Wrap<C>(pub C);

impl<C: Concern, S> Layer<S> for Wrap<C> {
    type Service = Wrapped<C, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Wrapped { concern: self.0.clone(), inner }
    }
}

/// The service a [`Wrap`] makes: the concern around `inner`.
#[derive(Clone, Debug)]
pub struct Wrapped<C, S> {
    concern: C,
    inner: S,
}

impl<C, S> Service<Request> for Wrapped<C, S>
where
    C: Concern,
    S: Next + Clone,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Responding;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Responding {
        // The ready service goes with the request; its clone takes its place here.
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        self.concern.around(req, ready)
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::{ServiceBuilder, ServiceExt, service_fn};

    use super::*;

    /// A concern that answers by itself when told to, else hands on and marks the answer.
    #[derive(Clone)]
    struct Gate(&'static str);

    impl Concern for Gate {
        fn around<S: Next>(&self, req: Request<Body>, mut next: S) -> Responding {
            let name = self.0;
            Box::pin(async move {
                if req.headers().contains_key("x-stop") {
                    let mut refused = Response::new(Body::empty());
                    *refused.status_mut() = StatusCode::FORBIDDEN;
                    return Ok(refused);
                }
                let mut resp = next.call(req).await?;
                resp.headers_mut().append("x-through", name.parse().expect("a header value"));
                Ok(resp)
            })
        }
    }

    fn inner() -> impl Service<Request<Body>, Response = Response, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + 'static {
        service_fn(|_req: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::from("answer"))) })
    }

    #[tokio::test]
    async fn concerns_run_outermost_first_and_one_may_answer_alone() {
        let stack =
            ServiceBuilder::new().layer(Wrap(Gate("outer"))).layer(Wrap(Gate("inner"))).service(inner());
        let resp = stack.clone().oneshot(Request::new(Body::empty())).await.expect("infallible");
        let through: Vec<_> = resp.headers().get_all("x-through").iter().collect();
        // The inner concern marks the answer first, the outer one last.
        assert_eq!(through, ["inner", "outer"]);
        let stopped = Request::builder().header("x-stop", "1").body(Body::empty()).expect("a request");
        let resp = stack.oneshot(stopped).await.expect("infallible");
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert!(resp.headers().get("x-through").is_none(), "nothing below the outer gate ran");
    }

    #[tokio::test]
    async fn the_id_is_given_before_the_limits_so_their_refusals_carry_it() {
        use crate::head_limit::LimitHead;
        use crate::request_id::{AssignIds, REQUEST_ID};

        // The handler answers with the id it saw.
        let echo = service_fn(|req: Request<Body>| async move {
            let seen = req.headers().get(&REQUEST_ID).cloned();
            let mut resp = Response::new(Body::empty());
            if let Some(id) = seen {
                resp.headers_mut().insert("x-seen", id);
            }
            Ok::<_, Infallible>(resp)
        });
        let stack =
            ServiceBuilder::new().layer(Wrap(AssignIds)).layer(Wrap(LimitHead::new(4096))).service(echo);
        let sane = Request::builder().header(&REQUEST_ID, "client-7").body(Body::empty()).expect("a request");
        let resp = stack.clone().oneshot(sane).await.expect("infallible");
        assert_eq!(resp.headers()[&REQUEST_ID], "client-7");
        assert_eq!(resp.headers()["x-seen"], "client-7", "the handler saw the id the client gets back");
        let huge = Request::builder()
            .header(&REQUEST_ID, "client-8")
            .header("cookie", "x".repeat(8192))
            .body(Body::empty())
            .expect("a request");
        let resp = stack.oneshot(huge).await.expect("infallible");
        assert_eq!(resp.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        assert_eq!(resp.headers()[&REQUEST_ID], "client-8", "the refusal carries the id");
        assert!(resp.headers().get("x-seen").is_none(), "no handler ran");
    }
}
