//! `verify check` as a user runs it: the report on standard output, the verdict in the exit
//! status (0 no violation, 1 violation, 2 unreadable history).

use std::process::Command;

fn run(history: &str) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    std::fs::write(&path, history).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_verify"))
        .arg("check")
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const GOOD: &str = r#"{"type":"invoke","process":"B","time":1,"f":"write","resource":"r","token":42,"value":"b"}
{"type":"ok","process":"B","time":2,"f":"write","resource":"r","token":42,"value":"b"}
{"type":"invoke","process":"A","time":3,"f":"write","resource":"r","token":41,"value":"a"}
{"type":"fail","process":"A","time":4,"f":"write","resource":"r","token":41,"value":"a","note":"FN001"}
{"type":"ok","process":"checker","time":5,"f":"read","resource":"r","value":["b"]}
"#;

#[test]
fn exit_status_tells_the_verdict() {
    let (code, out, _) = run(GOOD);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("holds     fencing") && out.ends_with("verdict: no violation\n"),
        "{out}"
    );

    let bad = GOOD
        .replace(r#""type":"fail""#, r#""type":"ok""#)
        .replace(r#""value":["b"]"#, r#""value":["b","a"]"#);
    let (code, out, _) = run(&bad);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("VIOLATED  fencing") && out.contains("[lines 2, 4]"),
        "{out}"
    );

    let (code, _, err) = run("{\"type\":\"ok\"}\n");
    assert_eq!(code, 2);
    assert!(err.contains("line 1:"), "{err}");
}

#[test]
fn the_timeline_is_written_and_shows_the_refused_write() {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("h.jsonl");
    let html = dir.path().join("t.html");
    std::fs::write(&history, GOOD).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_verify"))
        .arg("check")
        .arg(&history)
        .arg("--html")
        .arg(&html)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("<svg") && page.contains("refused token 41"),
        "{page}"
    );
}

#[test]
fn the_model_finds_the_counterexample_only_without_the_fence() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_verify"))
            .arg("model")
            .args(args)
            .output()
            .unwrap()
    };
    let fenced = run(&[]);
    assert_eq!(fenced.status.code(), Some(0));
    let unfenced = run(&["--no-fencing"]);
    assert_eq!(unfenced.status.code(), Some(1));
    let story = String::from_utf8_lossy(&unfenced.stdout);
    assert!(
        story.contains("COUNTEREXAMPLE") && story.contains("VIOLATION"),
        "{story}"
    );
    assert_eq!(run(&["--clients", "9"]).status.code(), Some(2));
}
