//! The subset's lexer.

use super::*;

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

    /// A line the subset accepts carries none of the characters that let bash
    /// run or redirect something other than its words.
    #[test]
    fn the_subset_admits_no_shell_syntax(line in "[a-z ;&|<>$`()'\"#\\\\*?~=.\\n-]{0,24}") {
        if let Some(tokens) = lex(&line) {
            for token in &tokens {
                if let Token::Word { span, .. } = token {
                    let raw = &line[span.0..span.1];
                    let unquoted: String = {
                        let mut out = String::new();
                        let mut quote = None;
                        for c in raw.chars() {
                            match (quote, c) {
                                (None, '\'' | '"') => quote = Some(c),
                                (Some(q), c) if c == q => quote = None,
                                (None, c) => out.push(c),
                                _ => {}
                            }
                        }
                        out
                    };
                    proptest::prop_assert!(
                        !unquoted.contains([';', '&', '|', '<', '>', '$', '`', '(', ')', '#', '\\', '\n']),
                        "{line:?} gave the word {raw:?}"
                    );
                    proptest::prop_assert!(!raw.starts_with('~'), "{line:?}");
                }
            }
        }
    }
}
