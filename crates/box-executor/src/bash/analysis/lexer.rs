//! The safe subset's lexer: a line cut into words, `&&`, `|` and the
//! trailing redirects, grouped into stages, or `None` when it is outside the
//! subset.

/// A token of the safe subset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Token {
    /// A word: its value after quote removal, whether an unquoted `*`/`?`
    /// made it a glob, and its byte span in the line.
    Word {
        value: String,
        glob: bool,
        span: (usize, usize),
    },
    /// `&&`.
    And,
    /// `|`.
    Pipe,
    /// One of the trailing redirects, as written.
    Redirect {
        text: &'static str,
        span: (usize, usize),
    },
}

/// Characters of an unquoted word.
pub(super) fn is_word_char(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"_./:@%+,=-".contains(&byte)
}

/// The redirects a subset stage may end with.
const TRAILING: &[&str] = &["2>&1", "2>/dev/null", ">/dev/null"];

/// Cut a line into subset tokens, or `None` when it is outside the subset.
pub(super) fn lex(line: &str) -> Option<Vec<Token>> {
    let bytes = line.as_bytes();
    if bytes
        .iter()
        .any(|byte| !(0x20..0x7f).contains(byte) && *byte != b'\t')
    {
        return None;
    }
    let mut tokens = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b' ' | b'\t' => at += 1,
            b'&' if bytes.get(at + 1) == Some(&b'&') => {
                tokens.push(Token::And);
                at += 2;
            }
            b'|' if bytes.get(at + 1) != Some(&b'|') && bytes.get(at + 1) != Some(&b'&') => {
                tokens.push(Token::Pipe);
                at += 1;
            }
            _ => {
                if let Some(text) = TRAILING.iter().find(|text| {
                    line[at..].starts_with(**text)
                        && matches!(
                            bytes.get(at + text.len()),
                            None | Some(b' ' | b'\t' | b'&' | b'|')
                        )
                }) {
                    tokens.push(Token::Redirect {
                        text,
                        span: (at, at + text.len()),
                    });
                    at += text.len();
                    continue;
                }
                let (token, next) = lex_word(line, at)?;
                if next == at {
                    return None;
                }
                tokens.push(token);
                at = next;
            }
        }
    }
    Some(tokens)
}

/// One subset word starting at `start`.
fn lex_word(line: &str, start: usize) -> Option<(Token, usize)> {
    let bytes = line.as_bytes();
    let mut value = String::new();
    let mut glob = false;
    let mut at = start;
    while at < bytes.len() {
        let byte = bytes[at];
        match byte {
            b' ' | b'\t' | b'&' | b'|' => break,
            b'\'' | b'"' => {
                let close = line[at + 1..].find(byte as char)? + at + 1;
                let inner = &line[at + 1..close];
                if byte == b'"' && inner.contains(['$', '`', '\\']) {
                    return None;
                }
                value.push_str(inner);
                at = close + 1;
            }
            b'~' | b'^' if at > start => {
                value.push(byte as char);
                at += 1;
            }
            b'*' | b'?' => {
                glob = true;
                value.push(byte as char);
                at += 1;
            }
            _ if is_word_char(byte) => {
                value.push(byte as char);
                at += 1;
            }
            _ => return None,
        }
    }
    Some((
        Token::Word {
            value,
            glob,
            span: (start, at),
        },
        at,
    ))
}

/// A stage: its words and trailing redirects, and the text as written.
#[derive(Debug)]
pub(super) struct Stage<'a> {
    pub(super) words: Vec<(String, bool)>,
    pub(super) redirects: Vec<&'static str>,
    pub(super) text: &'a str,
    pub(super) piped: bool,
}

impl Stage<'_> {
    /// The words joined by single spaces, redirects included: what a rule sees.
    pub(super) fn joined(&self) -> String {
        let mut parts: Vec<&str> = self.words.iter().map(|(word, _)| word.as_str()).collect();
        parts.extend(self.redirects.iter().copied());
        parts.join(" ")
    }
}

/// Group tokens into `&&`-separated segments of `|`-separated stages; `None`
/// when the structure is not the subset's (an empty stage, a redirect before
/// a word, a word after a redirect).
pub(super) fn structure<'a>(line: &'a str, tokens: &[Token]) -> Option<Vec<Vec<Stage<'a>>>> {
    let mut segments = vec![Vec::new()];
    let mut current: Option<Stage<'a>> = None;
    let mut piped = false;
    for token in tokens {
        match token {
            Token::Word { value, glob, span } => {
                let stage = current.get_or_insert_with(|| Stage {
                    words: Vec::new(),
                    redirects: Vec::new(),
                    text: &line[span.0..span.1],
                    piped,
                });
                if !stage.redirects.is_empty() {
                    return None;
                }
                stage.words.push((value.clone(), *glob));
                stage.text = extend(line, stage.text, span.1);
            }
            Token::Redirect { text, span } => {
                let stage = current.as_mut()?;
                stage.redirects.push(text);
                stage.text = extend(line, stage.text, span.1);
            }
            Token::And | Token::Pipe => {
                segments.last_mut()?.push(current.take()?);
                piped = *token == Token::Pipe;
                if !piped {
                    segments.push(Vec::new());
                }
            }
        }
    }
    segments.last_mut()?.push(current.take()?);
    Some(segments)
}

/// `text` (a slice of `line`) extended to end at byte `end`.
fn extend<'a>(line: &'a str, text: &'a str, end: usize) -> &'a str {
    let start = text.as_ptr() as usize - line.as_ptr() as usize;
    &line[start..end]
}

#[cfg(test)]
mod tests;
