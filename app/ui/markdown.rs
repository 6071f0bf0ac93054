//! Markdown in chat answers: headings, lists, quotes, bold / italic / strikethrough, inline code
//! and fenced code blocks (monospace frame, "Copy code" button), parsed with pulldown-cmark.
//!
//! A streaming answer changes every frame while the others stay put, so the parsed blocks are kept
//! in egui's frame cache keyed by the text: a message is parsed again only when its text changed,
//! and an unclosed code fence mid-stream is simply a code block that runs to the end so far.

use std::sync::Arc;

use egui::text::{LayoutJob, TextFormat};
use egui::{FontId, Stroke};
use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};

/// A run of text with one style.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Span {
    pub text: String,
    pub style: SpanStyle,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpanStyle {
    pub bold: bool,
    pub italic: bool,
    pub strike: bool,
    pub code: bool,
    pub link: bool,
}

/// The block structure we draw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    Heading {
        level: u8,
        spans: Vec<Span>,
    },
    Paragraph(Vec<Span>),
    Code {
        lang: String,
        code: String,
    },
    /// `start` is the first number of an ordered list.
    List {
        start: Option<u64>,
        items: Vec<Vec<Block>>,
    },
    Quote(Vec<Block>),
    Rule,
}

/// A container being filled while parsing.
enum Frame {
    Root,
    Quote,
    List {
        start: Option<u64>,
        items: Vec<Vec<Block>>,
    },
    Item,
}

/// Parser state: the open containers (each with its blocks so far) and the inline run.
struct Builder {
    stack: Vec<(Frame, Vec<Block>)>,
    spans: Vec<Span>,
    style: SpanStyle,
    /// Open emphasis / strong / strikethrough / link counts (they nest).
    depth: [u32; 4],
    heading: Option<u8>,
    code: Option<(String, String)>,
}

impl Builder {
    fn new() -> Self {
        Self {
            stack: vec![(Frame::Root, Vec::new())],
            spans: Vec::new(),
            style: SpanStyle::default(),
            depth: [0; 4],
            heading: None,
            code: None,
        }
    }

    fn push_block(&mut self, b: Block) {
        if let Some((_, blocks)) = self.stack.last_mut() {
            blocks.push(b);
        }
    }

    /// Ends the inline run (tight list items have text with no paragraph around it).
    fn flush(&mut self) {
        if self.spans.is_empty() {
            return;
        }
        let spans = std::mem::take(&mut self.spans);
        match self.heading {
            Some(level) => self.push_block(Block::Heading { level, spans }),
            None => self.push_block(Block::Paragraph(spans)),
        }
    }

    fn text(&mut self, text: &str, code: bool) {
        let style = SpanStyle { code, ..self.style };
        match self.spans.last_mut() {
            Some(last) if last.style == style => last.text.push_str(text),
            _ => self.spans.push(Span {
                text: text.to_owned(),
                style,
            }),
        }
    }

    /// Counts one more (or one fewer) open inline style and recomputes the style.
    fn inline(&mut self, which: usize, open: bool) {
        let d = &mut self.depth[which];
        *d = if open { *d + 1 } else { d.saturating_sub(1) };
        self.style = SpanStyle {
            italic: self.depth[0] > 0,
            bold: self.depth[1] > 0,
            strike: self.depth[2] > 0,
            link: self.depth[3] > 0,
            code: false,
        };
    }

    fn open(&mut self, frame: Frame) {
        self.flush();
        self.stack.push((frame, Vec::new()));
    }

    fn close(&mut self) {
        self.flush();
        if self.stack.len() < 2 {
            return;
        }
        let Some((frame, blocks)) = self.stack.pop() else {
            return;
        };
        match frame {
            Frame::Quote => self.push_block(Block::Quote(blocks)),
            Frame::List { start, items } => self.push_block(Block::List { start, items }),
            Frame::Item => {
                if let Some((Frame::List { items, .. }, _)) = self.stack.last_mut() {
                    items.push(blocks);
                }
            }
            Frame::Root => {}
        }
    }

    fn event(&mut self, ev: Event<'_>) {
        if let Some((_, code)) = &mut self.code {
            match ev {
                Event::Text(t) => code.push_str(&t),
                Event::End(TagEnd::CodeBlock) => {
                    if let Some((lang, mut code)) = self.code.take() {
                        if code.ends_with('\n') {
                            code.pop();
                        }
                        self.push_block(Block::Code { lang, code });
                    }
                }
                _ => {}
            }
            return;
        }
        match ev {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(t) | Event::Html(t) | Event::InlineHtml(t) => self.text(&t, false),
            Event::Code(t) => self.text(&t, true),
            Event::SoftBreak => self.text(" ", false),
            Event::HardBreak => self.text("\n", false),
            Event::Rule => {
                self.flush();
                self.push_block(Block::Rule);
            }
            Event::TaskListMarker(done) => self.text(if done { "[x] " } else { "[ ] " }, false),
            _ => {}
        }
    }

    fn start(&mut self, tag: Tag<'_>) {
        match tag {
            Tag::Paragraph => self.flush(),
            Tag::Heading { level, .. } => {
                self.flush();
                self.heading = Some(level as u8);
            }
            Tag::CodeBlock(kind) => {
                self.flush();
                let lang = match kind {
                    CodeBlockKind::Fenced(info) => {
                        info.split_whitespace().next().unwrap_or("").to_owned()
                    }
                    CodeBlockKind::Indented => String::new(),
                };
                self.code = Some((lang, String::new()));
            }
            Tag::BlockQuote(_) => self.open(Frame::Quote),
            Tag::List(start) => self.open(Frame::List {
                start,
                items: Vec::new(),
            }),
            Tag::Item => self.open(Frame::Item),
            Tag::Emphasis => self.inline(0, true),
            Tag::Strong => self.inline(1, true),
            Tag::Strikethrough => self.inline(2, true),
            Tag::Link { .. } => self.inline(3, true),
            _ => {}
        }
    }

    fn end(&mut self, tag: TagEnd) {
        match tag {
            TagEnd::Paragraph => self.flush(),
            TagEnd::Heading(_) => {
                self.flush();
                self.heading = None;
            }
            TagEnd::BlockQuote(_) | TagEnd::List(_) | TagEnd::Item => self.close(),
            TagEnd::Emphasis => self.inline(0, false),
            TagEnd::Strong => self.inline(1, false),
            TagEnd::Strikethrough => self.inline(2, false),
            TagEnd::Link => self.inline(3, false),
            _ => {}
        }
    }

    fn finish(mut self) -> Vec<Block> {
        if let Some((lang, code)) = self.code.take() {
            self.push_block(Block::Code { lang, code });
        }
        while self.stack.len() > 1 {
            self.close();
        }
        self.flush();
        self.stack.pop().map(|(_, b)| b).unwrap_or_default()
    }
}

/// Parses `text` into blocks (CommonMark plus strikethrough and task lists).
pub fn parse(text: &str) -> Vec<Block> {
    let mut b = Builder::new();
    for ev in Parser::new_ext(
        text,
        Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS,
    ) {
        b.event(ev);
    }
    b.finish()
}

#[derive(Default)]
struct Parse;

impl egui::cache::ComputerMut<&str, Arc<Vec<Block>>> for Parse {
    fn compute(&mut self, text: &str) -> Arc<Vec<Block>> {
        Arc::new(parse(text))
    }
}

/// Parsed messages, kept while they are drawn every frame (egui drops entries unused for a frame).
type ParseCache = egui::cache::FrameCache<Arc<Vec<Block>>, Parse>;

/// Draws `text` as markdown (parsed once per distinct text, see the module doc).
pub fn ui(ui: &mut egui::Ui, text: &str) {
    let blocks = ui.memory_mut(|m| Arc::clone(m.caches.cache::<ParseCache>().get(text)));
    ui.vertical(|ui| blocks_ui(ui, &blocks));
}

fn blocks_ui(ui: &mut egui::Ui, blocks: &[Block]) {
    let body = egui::TextStyle::Body.resolve(ui.style()).size;
    for (i, b) in blocks.iter().enumerate() {
        // A little air between paragraphs, code and lists (not after the last one).
        if i > 0 {
            ui.add_space(body * 0.3);
        }
        match b {
            Block::Paragraph(spans) => {
                ui.add(
                    egui::Label::new(job(ui, spans, body, false))
                        .selectable(true)
                        .wrap(),
                );
            }
            Block::Heading { level, spans } => {
                let scale = match level {
                    1 => 1.6,
                    2 => 1.35,
                    3 => 1.2,
                    _ => 1.05,
                };
                ui.add_space(2.0);
                let text = job(ui, spans, body * scale, true);
                ui.add(egui::Label::new(text).selectable(true).wrap());
            }
            Block::Code { lang, code } => code_ui(ui, lang, code),
            Block::List { start, items } => {
                for (i, item) in items.iter().enumerate() {
                    let marker = match start {
                        Some(s) => format!("{}.", s + i as u64),
                        None => "•".to_owned(),
                    };
                    ui.horizontal_top(|ui| {
                        ui.label(marker);
                        ui.vertical(|ui| blocks_ui(ui, item));
                    });
                }
            }
            Block::Quote(inner) => {
                let r = egui::Frame::new()
                    .inner_margin(egui::Margin {
                        left: 10,
                        ..egui::Margin::ZERO
                    })
                    .show(ui, |ui| blocks_ui(ui, inner))
                    .response
                    .rect;
                let stroke = ui.visuals().widgets.noninteractive.bg_stroke;
                ui.painter()
                    .vline(r.left() + 2.0, r.y_range(), Stroke::new(3.0, stroke.color));
            }
            Block::Rule => {
                ui.separator();
            }
        }
    }
}

/// A fenced code block: its language, a copy button, the code in monospace in a frame.
fn code_ui(ui: &mut egui::Ui, lang: &str, code: &str) {
    egui::Frame::group(ui.style())
        .fill(ui.visuals().extreme_bg_color)
        .show(ui, |ui| {
            ui.set_min_width(ui.available_width());
            ui.horizontal(|ui| {
                if !lang.is_empty() {
                    ui.label(egui::RichText::new(lang).small().weak());
                }
                if ui
                    .small_button("Copy code")
                    .on_hover_text("Copy this code block")
                    .clicked()
                {
                    ui.ctx().copy_text(code.to_owned());
                }
            });
            ui.add(
                egui::Label::new(egui::RichText::new(code).monospace())
                    .selectable(true)
                    .wrap(),
            );
        });
}

/// The spans as one layout job (bold shows as the strong text colour, as egui's `strong` does).
fn job(ui: &egui::Ui, spans: &[Span], size: f32, heading: bool) -> LayoutJob {
    let v = ui.visuals();
    let mut job = LayoutJob::default();
    for s in spans {
        let st = s.style;
        let mut color = if st.bold || heading {
            v.strong_text_color()
        } else {
            v.text_color()
        };
        if st.link {
            color = v.hyperlink_color;
        }
        let mut f = TextFormat {
            font_id: if st.code {
                FontId::monospace(size * 0.9)
            } else {
                FontId::proportional(size)
            },
            color,
            italics: st.italic,
            ..TextFormat::default()
        };
        if st.code {
            f.background = v.code_bg_color;
        }
        if st.strike {
            f.strikethrough = Stroke::new(1.0, color);
        }
        if st.link {
            f.underline = Stroke::new(1.0, color);
        }
        job.append(&s.text, 0.0, f);
    }
    job
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(spans: &[Span]) -> String {
        spans.iter().map(|s| s.text.as_str()).collect()
    }

    #[test]
    fn headings_lists_code_and_inline_styles() {
        let md = "# Title\n\nSome **bold** and *it* and `x`.\n\n- one\n- two\n   1. nested\n\n```rust\nfn main() {}\n```\n\n> quoted\n\n---\n";
        let b = parse(md);
        assert!(matches!(&b[0], Block::Heading { level: 1, spans } if plain(spans) == "Title"));
        let Block::Paragraph(p) = &b[1] else {
            panic!("{b:?}")
        };
        assert_eq!(plain(p), "Some bold and it and x.");
        assert!(p.iter().any(|s| s.text == "bold" && s.style.bold));
        assert!(p.iter().any(|s| s.text == "it" && s.style.italic));
        assert!(p.iter().any(|s| s.text == "x" && s.style.code));
        let Block::List { start: None, items } = &b[2] else {
            panic!("{b:?}")
        };
        assert_eq!(items.len(), 2);
        assert!(matches!(&items[1][1], Block::List { start: Some(1), .. }));
        assert_eq!(
            b[3],
            Block::Code {
                lang: "rust".into(),
                code: "fn main() {}".into()
            }
        );
        assert!(matches!(&b[4], Block::Quote(q) if q.len() == 1));
        assert_eq!(b[5], Block::Rule);
    }

    #[test]
    fn an_unclosed_fence_mid_stream_is_code_so_far() {
        let b = parse("Here:\n\n```py\nprint(1)\nprint(");
        assert_eq!(
            b[1],
            Block::Code {
                lang: "py".into(),
                code: "print(1)\nprint(".into()
            }
        );
    }
}
