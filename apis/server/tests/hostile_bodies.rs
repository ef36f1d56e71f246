//! Bodies built to expand: YAML alias bombs ("billion laughs" and a few aliases of a
//! large anchored list) and deep nesting, sent to every route that parses a body, with
//! the memory the server allocates while answering measured by this binary's allocator.
//! One test (the measurements need the process to themselves).

mod common;
use common::*;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

/// The system allocator, counting the bytes live now and the most live since a reset.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let now = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed)
                    + (new_size - layout.size());
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Most bytes a refused body (1 MB at most here) may make the server allocate beyond what
/// was live before: "a 1 MB body never builds more than a few MB". Undefended, the alias
/// bomb below builds 40 million JSON values (over 1.3 GB), and serde_yaml's event list
/// alone held 34 MB for 200 KB of `[[[[`.
const ALLOWED_GROWTH: usize = 12 << 20;

/// Billion laughs: nine levels of ten aliases, 10⁹ strings in under 1 KB.
fn billion_laughs() -> String {
    let mut doc = String::from(
        "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata: {name: lol}\nspec:\n  a0: &a0 [lol,lol,lol,lol,lol,lol,lol,lol,lol,lol]\n",
    );
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 10].join(",");
        doc.push_str(&format!("  a{i}: &a{i} [{refs}]\n"));
    }
    doc
}

/// Few alias jumps (within serde_yaml's own limit), each replaying 20,000 numbers: 40
/// million values in 150 KB.
fn wide_bomb() -> String {
    let wide: Vec<String> = (0..20_000).map(|i| i.to_string()).collect();
    format!(
        "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata: {{name: wide}}\nspec:\n  x: &x [{}]\n  y: [{}]\n",
        wide.join(","),
        vec!["*x"; 2_000].join(",")
    )
}

/// 1 MB of small elements, the most values per byte a body can hold without aliases.
fn flat(yaml: bool) -> String {
    let items = vec!["0"; 500_000].join(",");
    if yaml {
        format!("apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata: {{name: flat}}\nspec: {{x: [{items}]}}\n")
    } else {
        format!("{{\"apiVersion\":\"lattice.dev/v1alpha1\",\"kind\":\"Allocation\",\"metadata\":{{\"name\":\"flat\"}},\"spec\":{{\"x\":[{items}]}}}}")
    }
}

/// JSON nested 100,000 deep (200 KB).
fn deep_json() -> String {
    format!("{}{}", "[".repeat(100_000), "]".repeat(100_000))
}

async fn send(
    s: &TestServer,
    method: reqwest::Method,
    path: &str,
    ct: &str,
    body: String,
) -> (u16, Value, usize) {
    // Let the previous request's leftovers go before measuring.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let resp = s
        .client
        .request(method, s.url(path))
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .expect("an answer");
    let code = resp.status().as_u16();
    let v: Value = resp.json().await.unwrap_or(Value::Null);
    let growth = PEAK.load(Ordering::Relaxed).saturating_sub(before);
    (code, v, growth)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expanding_bodies_are_refused_within_bounded_memory() {
    let s = start().await;
    let (c, v) = s.post(&allocs("t1"), &alloc("exists", "t1")).await;
    assert_eq!(c, 201, "{v}");
    let item = format!("{}/exists", allocs("t1"));
    let yaml = "application/yaml";
    let apply = "application/apply-patch+yaml";
    use reqwest::Method as M;
    let cases: Vec<(M, String, &str, String, u16, &str)> = vec![
        (
            M::POST,
            allocs("t1"),
            yaml,
            wide_bomb(),
            413,
            "expands to more than",
        ),
        (
            M::PUT,
            item.clone(),
            yaml,
            wide_bomb(),
            413,
            "expands to more than",
        ),
        (
            M::PATCH,
            format!("{item}?fieldManager=m"),
            apply,
            wide_bomb(),
            413,
            "aliases",
        ),
        (
            M::PATCH,
            format!("{}/new?fieldManager=m", allocs("t1")),
            apply,
            wide_bomb(),
            413,
            "aliases",
        ),
        (
            M::POST,
            "/v1/allocations?tenant=t1".into(),
            yaml,
            wide_bomb(),
            413,
            "expands",
        ),
        (
            M::POST,
            allocs("t1"),
            yaml,
            billion_laughs(),
            413,
            "expands to more than",
        ),
        (
            M::POST,
            allocs("t1"),
            yaml,
            flat(true),
            413,
            "expands to more than",
        ),
        (
            M::POST,
            allocs("t1"),
            "application/json",
            flat(false),
            413,
            "expands to more than",
        ),
        (
            M::POST,
            allocs("t1"),
            yaml,
            "- ".repeat(500_000),
            400,
            "deeper than 64 levels",
        ),
        (
            M::POST,
            allocs("t1"),
            "application/json",
            deep_json(),
            400,
            "deeper than 64 levels",
        ),
        (
            M::POST,
            allocs("t1"),
            yaml,
            deep_json(),
            400,
            "deeper than 64 levels",
        ),
        (
            M::PATCH,
            item.clone(),
            "application/merge-patch+json",
            deep_json(),
            400,
            "deeper than 64",
        ),
        (
            M::PATCH,
            item.clone(),
            "application/json-patch+json",
            deep_json(),
            400,
            "deeper than 64",
        ),
        (
            M::DELETE,
            item.clone(),
            "application/json",
            deep_json(),
            400,
            "deeper than 64",
        ),
        (
            M::POST,
            "/v1/allocations/exists/tasks?tenant=t1".into(),
            "application/json",
            deep_json(),
            400,
            "deeper than 64",
        ),
        (
            M::PUT,
            "/v1/admin/config/scheduling.max_dag_size".into(),
            "application/json",
            deep_json(),
            400,
            "deeper than 64",
        ),
    ];
    for (method, path, ct, body, want, says) in cases {
        let (code, v, growth) = send(&s, method.clone(), &path, ct, body).await;
        let msg = v["message"].as_str().unwrap_or_default().to_string();
        assert_eq!(code, want, "{method} {path}: {v}");
        assert!(msg.contains(says), "{method} {path}: {msg}");
        eprintln!(
            "{method} {path} ({ct}): {code}, server grew by {} KiB",
            growth >> 10
        );
        assert!(
            growth < ALLOWED_GROWTH,
            "{method} {path}: the server allocated {} MiB",
            growth >> 20
        );
    }
    // And it still serves.
    let (c, _) = s.get(&item).await;
    assert_eq!(c, 200);
}
