//! The window's API server with `tpslab serve`'s options a front end needs, set in the
//! dashboard by their labels (egui_kittest) over the real default model: aliases listed and
//! served, CORS for a named origin (a preflight answered, others refused), a context size that
//! refuses a request past it, and an alias `serve --alias` would refuse refused alike; the key
//! read from a file.

use crate::gui_wait;
use crate::gui_window;
use gui_wait::wait_until;
use gui_window::{dashboard_on_default_model, has};

use std::io::{Read, Write};
use std::time::Duration;

use egui_kittest::kittest::Queryable;

/// One HTTP/1.1 exchange: (status, the whole response with its headers).
fn http(addr: &str, req: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    s.write_all(req.as_bytes()).expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    (status, out)
}

fn request(addr: &str, method: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
    http(
        addr,
        &format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n{headers}\r\n{body}",
            body.len()
        ),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[test]
fn the_window_serves_with_aliases_cors_and_a_context_size() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut h = dashboard_on_default_model(|s| s.dash.server.port = port);
    // A control character is no alias (the text field drops typed ones; a saved state may
    // hold one): refused with serve's own words, nothing started.
    h.state_mut().state.dash.server.aliases = "bad\u{7}name".into();
    h.run_steps(2);
    h.get_by_label("Start API server").click();
    wait_until(&mut h, "the alias refused", 10, |h| {
        has(h, "an alias is 1 to 256 printable characters")
    });
    assert!(!has(&h, "Serving http://"));

    let s = &mut h.state_mut().state.dash.server;
    s.aliases = String::new();
    h.run_steps(2);
    for (field, text) in [
        ("Aliases (comma separated)", "my-model, team/model"),
        ("CORS origins (comma separated)", "http://localhost:3000"),
    ] {
        h.get_by_label(field).focus();
        h.step();
        h.get_by_label(field).type_text(text);
        h.step();
    }
    assert_eq!(h.state().state.dash.server.aliases, "my-model, team/model");
    h.get_by_label("Context size (0: the model's)")
        .set_value_accesskit(64.0);
    h.run_steps(2);
    h.get_by_label("Start API server").click();
    wait_until(&mut h, "the server to run", 10, |h| {
        has(h, &format!("Serving http://{addr}/v1"))
    });

    let (status, body) = request(&addr, "GET", "/v1/models", "", "");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("\"my-model\"") && body.contains("\"team/model\""),
        "{body}"
    );
    // An alias is served as the model.
    let req = r#"{"model": "my-model", "prompt": "Hi", "max_tokens": 2, "temperature": 0}"#;
    let (status, body) = request(&addr, "POST", "/v1/completions", "", req);
    assert_eq!(status, 200, "{body}");

    // A browser page on the named origin gets its preflight answered; another origin does not.
    let preflight = |origin: &str| {
        request(
            &addr,
            "OPTIONS",
            "/v1/chat/completions",
            &format!(
                "Origin: {origin}\r\nAccess-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: content-type\r\n"
            ),
            "",
        )
    };
    let (status, out) = preflight("http://localhost:3000");
    assert!((200..300).contains(&status), "{out}");
    assert!(
        out.to_ascii_lowercase()
            .contains("access-control-allow-origin: http://localhost:3000"),
        "{out}"
    );
    let (_, out) = preflight("http://evil.example");
    assert!(
        !out.to_ascii_lowercase()
            .contains("access-control-allow-origin"),
        "{out}"
    );

    // Prompt and answer past 64 tokens: the context size refuses it.
    let req = r#"{"prompt": "The capital of France is", "max_tokens": 100}"#;
    let (status, body) = request(&addr, "POST", "/v1/completions", "", req);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("context_length_exceeded"), "{body}");
}

/// The key from a file named in the settings (its path saved, the key not): an empty file is
/// refused as `serve --api-key-file` refuses it, nothing started; a file with the key starts a
/// server that answers 401 without it and 200 with it.
#[test]
fn the_window_server_reads_its_key_from_a_file() {
    let dir = crate::temp_dir::TempDir::new("gui-key-file");
    let key_file = dir.join("key.txt");
    std::fs::write(&key_file, "\n").expect("empty key file");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut h = dashboard_on_default_model(|s| s.dash.server.port = port);
    let field = "API key file (its first line)";
    h.get_by_label(field).focus();
    h.step();
    h.get_by_label(field).type_text(&key_file.to_string_lossy());
    h.step();
    h.get_by_label("Start API server").click();
    wait_until(&mut h, "the empty key refused", 10, |h| has(h, "is empty"));
    assert!(!has(&h, "Serving http://"));

    std::fs::write(&key_file, "  s3cret-from-file  \nsecond line ignored\n").expect("key file");
    h.get_by_label("Start API server").click();
    wait_until(&mut h, "the server to run", 10, |h| {
        has(h, &format!("Serving http://{addr}/v1"))
    });
    let saved = serde_json::to_string(&h.state().state).expect("state as JSON");
    assert!(!saved.contains("s3cret-from-file"), "the key is not saved");
    assert!(saved.contains("key.txt"), "the key file's path is");
    let (status, body) = request(&addr, "GET", "/v1/models", "", "");
    assert_eq!(status, 401, "{body}");
    let bearer = "Authorization: Bearer s3cret-from-file\r\n";
    let (status, body) = request(&addr, "GET", "/v1/models", bearer, "");
    assert_eq!(status, 200, "{body}");
}
