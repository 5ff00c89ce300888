//! The versioned binary encoding of every value Rota stores or sends: one format
//! version byte, then bincode (standard configuration, varint integers).

use std::io;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The value format this build writes and reads.
pub const VALUE_FORMAT_VERSION: u8 = 1;

/// Largest value the decoder accepts, so a corrupt length cannot exhaust memory.
pub const VALUE_BYTES_MAX: usize = 512 * 1024 * 1024;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<VALUE_BYTES_MAX>()
}

/// Room a value's encoding starts with: most log entries fit, where a buffer grown from
/// empty was reallocated six times per entry (15% of a follower's instructions went to
/// growing them; docs/performance.md, session 37).
const ENCODE_CAPACITY: usize = 256;

/// Encodes `value` behind the format version byte.
pub fn encode_value<T: Serialize + ?Sized>(value: &T) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(ENCODE_CAPACITY);
    bytes.push(VALUE_FORMAT_VERSION);
    bincode::serde::encode_into_std_write(value, &mut bytes, config())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("encoding: {e}")))?;
    Ok(bytes)
}

/// How many bytes [`encode_value`] makes of `value`, found without making them.
pub fn encoded_len<T: Serialize + ?Sized>(value: &T) -> io::Result<usize> {
    let mut size = bincode::enc::write::SizeWriter::default();
    bincode::serde::encode_into_writer(value, &mut size, config())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("encoding: {e}")))?;
    Ok(1 + size.bytes_written)
}

/// Decodes a value written by [`encode_value`]; `what` names it in errors.
pub fn decode_value<T: DeserializeOwned>(bytes: &[u8], what: &str) -> io::Result<T> {
    let invalid = |message: String| io::Error::new(io::ErrorKind::InvalidData, message);
    let Some((&version, body)) = bytes.split_first() else {
        return Err(invalid(format!("{what}: empty value")));
    };
    if version != VALUE_FORMAT_VERSION {
        return Err(invalid(format!(
            "{what}: value format {version} is not supported (this build reads {VALUE_FORMAT_VERSION})"
        )));
    }
    let (value, used) = bincode::serde::decode_from_slice(body, config())
        .map_err(|e| invalid(format!("{what}: {e}")))?;
    if used != body.len() {
        return Err(invalid(format!(
            "{what}: {} trailing bytes after the value",
            body.len() - used
        )));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_other_versions() {
        let bytes = encode_value(&(7u64, "x".to_string())).expect("encodes");
        let back: (u64, String) = decode_value(&bytes, "pair").expect("decodes");
        assert_eq!(back, (7, "x".to_string()));
        let mut newer = bytes.clone();
        newer[0] = 2;
        let err = decode_value::<(u64, String)>(&newer, "pair").expect_err("version");
        assert!(err.to_string().contains("value format 2"), "{err}");
        assert!(decode_value::<(u64, String)>(&[], "pair").is_err());
    }

    #[test]
    fn the_encoded_length_is_the_encodings() {
        for value in [(7u64, String::new()), (300, "x".repeat(5000))] {
            let bytes = encode_value(&value).expect("encodes");
            assert_eq!(encoded_len(&value).expect("measures"), bytes.len());
        }
    }
}
