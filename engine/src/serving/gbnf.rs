//! llama.cpp's GBNF grammars rewritten in llguidance's Lark dialect (llguidance's Rust crate
//! reads Lark, not GBNF): `name ::= ...` rules, "strings", [classes], `.`, groups, `|`, `*`, `+`,
//! `?`, `{m,n}` and `#` comments. `root` is the start rule.

use std::fmt::Write as _;

/// Why a GBNF grammar cannot be converted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{msg} (at byte {at})")]
pub struct GbnfError {
    pub msg: String,
    pub at: usize,
}

fn err<T>(msg: impl Into<String>, at: usize) -> Result<T, GbnfError> {
    Err(GbnfError {
        msg: msg.into(),
        at,
    })
}

/// Rule names become `g_` + lowercase with `-` as `_` (Lark's rule names are lowercase and
/// take no dashes; the prefix keeps them clear of Lark's own `start`).
fn rule_name(n: &str) -> String {
    format!("g_{}", n.to_ascii_lowercase().replace('-', "_"))
}

/// One GBNF escape after `\` at `s[i..]`: the char and the bytes it took.
fn escape(s: &str, i: usize) -> Result<(char, usize), GbnfError> {
    let rest = &s[i..];
    let mut it = rest.chars();
    let Some(c) = it.next() else {
        return err("a backslash ends the grammar", i);
    };
    let hex = |n: usize| -> Result<(char, usize), GbnfError> {
        let digits = rest
            .get(1..=n)
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()));
        let Some(code) = digits.and_then(|d| u32::from_str_radix(d, 16).ok()) else {
            return err(format!("\\{c} needs {n} hex digits"), i);
        };
        char::from_u32(code)
            .map_or_else(|| err("escape is not a character", i), |ch| Ok((ch, n + 1)))
    };
    match c {
        'n' => Ok(('\n', 1)),
        't' => Ok(('\t', 1)),
        'r' => Ok(('\r', 1)),
        'x' => hex(2),
        'u' => hex(4),
        'U' => hex(8),
        '\\' | '"' | '[' | ']' | '-' | '^' => Ok((c, 1)),
        _ => err(format!("unknown escape \\{c}"), i),
    }
}

/// A char inside a regex class, escaped as Rust's regex (and Lark's `/.../` delimiter) need.
fn class_char(out: &mut String, c: char) {
    match c {
        '\\' | ']' | '[' | '^' | '-' | '/' | '&' | '~' => {
            out.push('\\');
            out.push(c);
        }
        c if c.is_control() || c == ' ' => {
            let _ = write!(out, "\\x{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// A string literal at `src[i..]` (opening quote included) as a Lark (JSON) string; returns it
/// and the index past the closing quote.
fn string_lit(src: &str, mut i: usize) -> Result<(String, usize), GbnfError> {
    let start = i;
    i += 1;
    let mut text = String::new();
    loop {
        let Some(ch) = src[i..].chars().next() else {
            return err("a string is not closed", start);
        };
        match ch {
            '"' => break,
            '\\' => {
                let (e, n) = escape(src, i + 1)?;
                text.push(e);
                i += 1 + n;
            }
            ch => {
                text.push(ch);
                i += ch.len_utf8();
            }
        }
    }
    let lit = serde_json::to_string(&text).unwrap_or_default();
    Ok((lit, i + 1))
}

/// A character class at `src[i..]` (`[` included) as a Lark regex; returns it and the index
/// past the `]`.
fn class_lit(src: &str, mut i: usize) -> Result<(String, usize), GbnfError> {
    let start = i;
    i += 1;
    let mut class = String::from("/[");
    if src.as_bytes().get(i) == Some(&b'^') {
        class.push('^');
        i += 1;
    }
    loop {
        let Some(ch) = src[i..].chars().next() else {
            return err("a character class is not closed", start);
        };
        match ch {
            ']' => break,
            '-' => {
                class.push('-');
                i += 1;
            }
            '\\' => {
                let (e, n) = escape(src, i + 1)?;
                class_char(&mut class, e);
                i += 1 + n;
            }
            ch => {
                class_char(&mut class, ch);
                i += ch.len_utf8();
            }
        }
    }
    class.push_str("]/");
    Ok((class, i + 1))
}

/// A `{m}`, `{m,}` or `{m,n}` repetition at `src[i..]`; returns it (spaces dropped) and the
/// index past the `}`.
fn repetition(src: &str, mut i: usize) -> Result<(String, usize), GbnfError> {
    let (start, b) = (i, src.as_bytes());
    i += 1;
    while i < b.len() && b[i] != b'}' {
        if !(b[i].is_ascii_digit() || b[i] == b',' || b[i] == b' ') {
            return err("a repetition holds only digits and a comma", i);
        }
        i += 1;
    }
    if i >= b.len() {
        return err("a repetition is not closed", start);
    }
    let rep = src[start..=i].chars().filter(|c| *c != ' ').collect();
    Ok((rep, i + 1))
}

/// Appends a postfix operator to the last item (Lark binds it to what precedes, no space).
fn postfix(out: &mut String, op: &str) {
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
    out.push_str(op);
    out.push(' ');
}

fn is_name(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-' || c == b'_'
}

/// Converts a GBNF grammar to Lark (`start: g_root`, one line per rule).
pub fn gbnf_to_lark(src: &str) -> Result<String, GbnfError> {
    let mut rules: Vec<(String, String)> = Vec::new();
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            c if c.is_ascii_whitespace() => i += 1,
            c if is_name(c) => {
                let start = i;
                while i < b.len() && is_name(b[i]) {
                    i += 1;
                }
                let name = rule_name(&src[start..i]);
                let mut j = i;
                while j < b.len() && (b[j] == b' ' || b[j] == b'\t') {
                    j += 1;
                }
                if src[j..].starts_with("::=") {
                    rules.push((name, String::new()));
                    i = j + 3;
                } else {
                    let out = body(&mut rules, start)?;
                    out.push_str(&name);
                    out.push(' ');
                }
            }
            b'"' | b'[' | b'{' => {
                let (item, next) = match c {
                    b'"' => string_lit(src, i)?,
                    b'[' => class_lit(src, i)?,
                    _ => repetition(src, i)?,
                };
                let out = body(&mut rules, i)?;
                if c == b'{' {
                    postfix(out, &item);
                } else {
                    out.push_str(&item);
                    out.push(' ');
                }
                i = next;
            }
            b'.' => {
                body(&mut rules, i)?.push_str("/(?s:.)/ ");
                i += 1;
            }
            b'(' | b')' | b'|' => {
                let out = body(&mut rules, i)?;
                out.push(char::from(c));
                out.push(' ');
                i += 1;
            }
            b'*' | b'+' | b'?' => {
                postfix(body(&mut rules, i)?, &char::from(c).to_string());
                i += 1;
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return err(format!("unexpected {ch:?}"), i);
            }
        }
    }
    if !rules.iter().any(|(n, _)| n == "g_root") {
        return err("the grammar has no root rule", 0);
    }
    let mut out = String::from("start: g_root\n");
    for (name, body) in &rules {
        if body.trim().is_empty() {
            return err(format!("rule {name} is empty"), 0);
        }
        let _ = writeln!(out, "{name}: {}", body.trim_end());
    }
    Ok(out)
}

/// The body of the rule being defined.
fn body(rules: &mut [(String, String)], at: usize) -> Result<&mut String, GbnfError> {
    match rules.last_mut() {
        Some((_, b)) => Ok(b),
        None => err("text before the first rule (`name ::= ...`)", at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_the_usual_forms() {
        let g = "root ::= \"yes\" | \"no\" ws-x # answer\nws-x ::= [ \\t\\n]* ( [a-z]{1,3} )?\n";
        let l = gbnf_to_lark(g).expect("converts");
        assert_eq!(
            l,
            "start: g_root\ng_root: \"yes\" | \"no\" g_ws_x\ng_ws_x: /[\\x{20}\\x{9}\\x{a}]/* ( /[a-z]/{1,3} )?\n"
        );
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for bad in [
            "",
            "x ::= \"a\"",
            "root ::= \"open",
            "root ::= [a-",
            "\"a\"",
            "root ::= \"\\q\"",
        ] {
            assert!(gbnf_to_lark(bad).is_err(), "{bad:?}");
        }
    }
}
