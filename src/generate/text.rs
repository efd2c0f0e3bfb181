//! Text in and out of a decoder: prompts encoded into token ids and generated ids decoded
//! back, through a Hugging Face `tokenizer.json` (the `tokenizers` crate, which reads every
//! tokenizer the Hugging Face hub ships in that format: byte-level BPE, SentencePiece-style
//! Unigram, WordPiece, word-level).

use std::path::{Path, PathBuf};

use super::GenerateError;

/// A tokenizer file, loaded.
pub struct TextCodec {
    tokenizer: tokenizers::Tokenizer,
    path: PathBuf,
}

impl TextCodec {
    /// Loads `path` (a `tokenizer.json`); the error names the file.
    pub fn load(path: &Path) -> Result<TextCodec, GenerateError> {
        let tokenizer = tokenizers::Tokenizer::from_file(path).map_err(|e| {
            GenerateError::Input(format!(
                "{}: not a tokenizer file (tokenizer.json) fusec can read: {e}",
                path.display()
            ))
        })?;
        Ok(TextCodec { tokenizer, path: path.to_path_buf() })
    }

    /// The token ids of `text` (with the special tokens the tokenizer adds, such as a
    /// beginning-of-sequence token).
    pub fn encode(&self, text: &str) -> Result<Vec<i64>, GenerateError> {
        let encoding = self.tokenizer.encode(text, true).map_err(|e| {
            GenerateError::Input(format!("{}: cannot encode {text:?}: {e}", self.path.display()))
        })?;
        Ok(encoding.get_ids().iter().map(|&id| i64::from(id)).collect())
    }

    /// The text of token ids (special tokens left out); an id outside the vocabulary is an
    /// error naming it.
    pub fn decode(&self, ids: &[i64]) -> Result<String, GenerateError> {
        let size = self.tokenizer.get_vocab_size(true);
        let ids: Vec<u32> = ids
            .iter()
            .map(|&id| {
                u32::try_from(id).ok().filter(|&i| (i as usize) < size).ok_or_else(|| {
                    GenerateError::Input(format!(
                        "{}: token id {id} is outside the tokenizer's vocabulary of {size}",
                        self.path.display()
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        self.tokenizer
            .decode(&ids, true)
            .map_err(|e| GenerateError::Input(format!("{}: cannot decode {ids:?}: {e}", self.path.display())))
    }
}
