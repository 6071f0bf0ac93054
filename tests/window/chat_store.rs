//! The chat's saved state without a window: a chat saved by the first format (no version, no
//! branches) loads; branches move as ‹ › does; the search; exports round-trip through a file,
//! hostile imports are clear errors; a save killed half-way loses no saved chat.

use crate::temp_dir;
use temp_dir::TempDir;

use tpslab::ui::AppState;
use tpslab::ui::panels::chat::{
    AnswerStats, CHAT_SCHEMA, ChatState, Conversation, Message, Role, answer_stats_text,
};
use tpslab::ui::panels::chat_files::{self, MAX_IMPORT_BYTES};
use tpslab::ui::state_file;

fn user(text: &str) -> Message {
    Message {
        role: Role::User,
        text: text.into(),
        ..Message::default()
    }
}

fn answer(text: &str) -> Message {
    Message {
        role: Role::Assistant,
        text: text.into(),
        stats: Some(AnswerStats {
            tokens: 3,
            ttft_ms: Some(12.0),
            decode_tps: Some(40.0),
            finish: "stop".into(),
            batch_mean: Some(1.5),
            batch_max: Some(2),
            ..AnswerStats::default()
        }),
        ..Message::default()
    }
}

/// A conversation whose answer has three branches, the second shown.
fn branched() -> Conversation {
    let filled = |m: Message, text: &str| Message {
        others: m.others,
        shown: m.shown,
        ..answer(text)
    };
    let second = filled(answer("first answer").regenerated(), "second answer");
    let mut a = filled(second.regenerated(), "third answer");
    a.show(1);
    Conversation {
        id: 7,
        title: "Branches".into(),
        system: "Be brief.".into(),
        stop_sequences: "END\n\nSTOP".into(),
        messages: vec![user("Hello?"), a],
        ..Conversation::default()
    }
}

#[test]
fn a_chat_saved_in_the_first_format_loads() {
    // Version 1 as the window saved it: no version, branches, stop sequences or presets.
    let v1 = r#"{"tab":"Chat","chat":{"conversations":[{"id":3,"title":"Old chat",
        "system":"","max_tokens":64,"draft":"unsent","json_schema_on":false,"json_schema":"",
        "sampling":{"temperature":0.5,"top_k":0,"top_p":1.0,"min_p":0.0,
            "repetition_penalty":1.0,"frequency_penalty":0.0,"presence_penalty":0.0,
            "seed":null,"logit_bias":[]},
        "messages":[{"role":"User","text":"Hi","reasoning":"","stats":null},
            {"role":"Assistant","text":"Hello!","reasoning":"hmm","stats":{"tokens":2,
             "ttft_ms":5.0,"decode_tps":null,"finish":"stop","reasoning_tokens":1,
             "reasoning_ms":null}}]}],
        "active":3,"next_id":4,"show_settings":false}}"#;
    let state: AppState = serde_json::from_str(v1).expect("the first format loads");
    let chat = &state.chat;
    assert_eq!(chat.version, 1);
    assert_eq!(chat.active, 3);
    let conv = &chat.conversations[0];
    assert_eq!(
        (conv.title.as_str(), conv.draft.as_str()),
        ("Old chat", "unsent")
    );
    assert_eq!(conv.messages.len(), 2);
    let a = &conv.messages[1];
    assert_eq!((a.text.as_str(), a.reasoning.as_str()), ("Hello!", "hmm"));
    assert_eq!((a.branches(), a.shown), (1, 0));
    let stats = a.stats.as_ref().expect("figures");
    assert_eq!(
        (stats.tokens, stats.batch_mean, stats.batch_max),
        (2, None, None)
    );
    assert!(conv.stop_strings().is_empty());
    assert!(!chat.presets.is_empty(), "the default presets");
    // Saved again, it is the current format, and loads as it was.
    let json = serde_json::to_string(&state).expect("saves");
    let again: AppState = serde_json::from_str(&json).expect("loads");
    assert_eq!(again.chat.version, CHAT_SCHEMA);
    assert_eq!(again.chat.conversations, state.chat.conversations);
}

#[test]
fn branches_keep_every_answer_of_a_turn() {
    let conv = branched();
    let a = &conv.messages[1];
    assert_eq!(
        (a.branches(), a.shown, a.text.as_str()),
        (3, 1, "second answer")
    );
    let texts = |m: &Message| -> Vec<String> {
        (0..m.branches())
            .map(|k| {
                let mut m = m.clone();
                m.show(k);
                assert_eq!(m.shown, k);
                m.text
            })
            .collect()
    };
    assert_eq!(texts(a), ["first answer", "second answer", "third answer"]);
    // There and back leaves it as it was; out of range changes nothing.
    let mut m = a.clone();
    m.show(2);
    m.show(0);
    m.show(1);
    assert_eq!(&m, a);
    m.show(3);
    assert_eq!(&m, a);
    // The stored form keeps them.
    let json = serde_json::to_string(&conv).expect("saves");
    let back: Conversation = serde_json::from_str(&json).expect("loads");
    assert_eq!(back, conv);
}

#[test]
fn the_search_finds_titles_and_text_in_any_case() {
    let conv = branched();
    for hit in ["", "branches", "HELLO", "Third Answer", "first"] {
        assert!(conv.matches(hit), "{hit:?}");
    }
    for miss in ["goodbye", "brief"] {
        assert!(!conv.matches(miss), "{miss:?}");
    }
    assert_eq!(conv.stop_strings(), ["END", "STOP"]);
}

#[test]
fn an_export_round_trips_through_a_file() {
    let dir = TempDir::new("chat-export");
    let conv = branched();
    let path = dir.join("chat.json");
    chat_files::export(&conv, &path, false).expect("export");
    let back = chat_files::import(&path).expect("import");
    assert_eq!(back, conv);
    // Imported, it is a new conversation beside the others, which stay as they were.
    let mut state = ChatState::default();
    state.conversations.push(Conversation {
        id: 7,
        ..Conversation::default()
    });
    let before = state.conversations.clone();
    let id = state.add(back);
    assert!(before.iter().all(|c| c.id != id), "a fresh id");
    assert_eq!(state.active, id);
    assert_eq!(&state.conversations[..before.len()], &before[..]);

    let md_path = dir.join("chat.md");
    chat_files::export(&conv, &md_path, true).expect("markdown");
    let md = std::fs::read_to_string(&md_path).expect("read");
    assert!(md.starts_with("# Branches\n"), "{md}");
    assert!(md.contains("> Be brief."), "{md}");
    assert!(md.contains("## You\n\nHello?"), "{md}");
    assert!(
        md.contains("## Assistant (answer 2 of 3)\n\nsecond answer"),
        "{md}"
    );
    let stats = conv.messages[1].stats.as_ref().expect("figures");
    assert!(md.contains(&answer_stats_text(stats)), "{md}");
    assert!(answer_stats_text(stats).contains("batch 1.5 (max 2)"));
    // Markdown is to read, not to import.
    assert!(chat_files::import(&md_path).is_err());
}

#[test]
fn hostile_imports_are_clear_errors() {
    let dir = TempDir::new("chat-import");
    let good = String::from_utf8(chat_files::to_json(&branched()).expect("json")).expect("utf8");
    let cases: Vec<(&str, String, &str)> = vec![
        ("not json", "{\"format\": ".into(), "not a JSON chat export"),
        ("an array", "[1, 2]".into(), "not a JSON chat export"),
        (
            "another format",
            good.replace("tpslab-chat", "something-else"),
            "not a TPS Lab chat export",
        ),
        (
            "a newer version",
            good.replacen(&format!("\"version\": {CHAT_SCHEMA}"), "\"version\": 99", 1),
            "newer TPS Lab",
        ),
        (
            "no version",
            good.replacen(&format!("\"version\": {CHAT_SCHEMA},"), "", 1),
            "no \"version\"",
        ),
        (
            "a wrong type",
            good.replacen("\"title\": \"Branches\"", "\"title\": 5", 1),
            "not valid",
        ),
        (
            "no conversation",
            format!("{{\"format\": \"tpslab-chat\", \"version\": {CHAT_SCHEMA}}}"),
            "not valid",
        ),
        (
            "a branch out of range",
            good.replacen("\"shown\": 1", "\"shown\": 9", 1),
            "shows answer 10 of 3",
        ),
        (
            "bad sampling",
            good.replacen("\"top_p\": 0.9", "\"top_p\": -3.0", 1),
            "sampling",
        ),
    ];
    for (what, text, says) in cases {
        assert_ne!(text, good, "{what}: the case changed nothing");
        let path = dir.join(format!("{}.json", what.replace(' ', "-")));
        std::fs::write(&path, &text).expect("write");
        let e = chat_files::import(&path).expect_err(what);
        assert!(e.contains(says), "{what}: {e}");
        assert!(e.contains("cannot import"), "{what}: {e}");
    }
    // A user's message with branches, a branch with its own.
    let mut conv = branched();
    conv.messages[0].others.push(answer("?"));
    assert!(chat_files::from_json(&chat_files::to_json(&conv).expect("json")).is_err());
    let mut conv = branched();
    conv.messages[1].others[0].others.push(answer("?"));
    let e = chat_files::from_json(&chat_files::to_json(&conv).expect("json")).expect_err("nested");
    assert!(e.contains("branches of its own"), "{e}");
    // Too big: refused before it is parsed (a sparse file, nothing written).
    let big = dir.join("big.json");
    let f = std::fs::File::create(&big).expect("create");
    f.set_len(MAX_IMPORT_BYTES + 1).expect("size");
    let e = chat_files::import(&big).expect_err("too big");
    assert!(e.contains("over 32 MiB"), "{e}");
    let e = chat_files::import(&dir.join("missing.json")).expect_err("missing");
    assert!(e.contains("missing.json"), "{e}");
}

/// What a save killed half-way leaves (its temporary file) does not cost the saved chat.
#[test]
fn a_save_killed_half_way_keeps_the_saved_chat() {
    let dir = TempDir::new("chat-save");
    let path = dir.join("window-state.json");
    let mut state = AppState::default();
    state.chat.conversations = vec![branched()];
    state.chat.active = 7;
    state_file::save(&path, &state).expect("save");
    let whole = std::fs::read(&path).expect("read");
    let temp = dir.join(".window-state.json.4000000000-1-2.tmp");
    std::fs::write(&temp, &whole[..whole.len() / 3]).expect("torn temp");
    let loaded: AppState = state_file::load(&path).expect("the last save loads");
    assert_eq!(loaded.chat.conversations, state.chat.conversations);
    assert!(!temp.exists(), "the torn temporary file is swept away");
}

/// The window's saver: saves written by its worker land whole, the newest last; one written
/// at once (on exit) is never undone by an older one still waiting.
#[test]
fn the_saver_writes_the_newest_state_whole() {
    let dir = TempDir::new("chat-saver");
    let path = dir.join("window-state.json");
    let mut saver = state_file::Saver::new(path.clone());
    let with = |n: usize| {
        let mut s = AppState::default();
        s.chat.conversations[0].messages = (0..n).map(|i| user(&format!("message {i}"))).collect();
        s
    };
    for n in 1..=20 {
        saver.save_later(&with(n)).expect("queued");
    }
    saver.save_now(&with(21)).expect("saved");
    // Whatever the worker still had, the file keeps the last save.
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(10));
        let loaded: AppState = state_file::load(&path).expect("loads");
        assert_eq!(loaded, with(21));
    }
    saver.save_later(&with(22)).expect("queued");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while state_file::load::<AppState>(&path) != Some(with(22)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never wrote"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
