//! Graph passes, one file per pass.
