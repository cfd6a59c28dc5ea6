//! A bounded scan of a Parquet file's Thrift structures (the footer and every
//! page header) before the parquet crate parses them.
//!
//! The parquet crate (59.3.2) skips unknown Thrift fields by walking them, and
//! takes a boolean in a list to occupy no bytes: a few bytes claiming a list of
//! two billion booleans cost it seconds, and nested such lists cost it hours
//! (fuzzing found one). This scan reads the same structures with the same rules
//! and refuses a header whose elements add up to more than a budget, so the
//! parquet crate only ever parses headers whose walk is short; and it refuses a
//! page that claims to decompress to far more than its bytes could.

/// Elements a single Thrift structure may claim (list and map entries, in all
/// its nested lists together): far above any real footer or page header.
const ELEMENT_BUDGET: u64 = 50_000_000;
/// Nesting deeper than the parquet crate's own skip limit is refused too.
const MAX_DEPTH: u32 = 64;

/// A cursor over compact-protocol Thrift bytes.
struct Scan<'a> {
    buf: &'a [u8],
    pos: usize,
    elements: u64,
}

fn zigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

impl Scan<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or("a Thrift header is truncated")?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a Thrift varint is too long".into())
    }

    fn skip(&mut self, n: u64) -> Result<(), String> {
        let left = (self.buf.len() - self.pos) as u64;
        if n > left {
            return Err(format!("a Thrift value claims {n} bytes, {left} remain"));
        }
        self.pos += n as usize;
        Ok(())
    }

    fn claim(&mut self, n: u64) -> Result<(), String> {
        self.elements = self.elements.saturating_add(n);
        if self.elements > ELEMENT_BUDGET {
            return Err(format!(
                "a Thrift header claims more than {ELEMENT_BUDGET} list elements"
            ));
        }
        Ok(())
    }

    /// One value of compact type `ty`; an integer's value is returned.
    fn value(&mut self, ty: u8, depth: u32) -> Result<Option<i64>, String> {
        if depth > MAX_DEPTH {
            return Err("Thrift values nest too deeply".into());
        }
        match ty {
            // Booleans: in a field header the type is the value; in a list the
            // parquet crate reads nothing for them either.
            1 | 2 => Ok(None),
            3 => self.skip(1).map(|_| None),
            4..=6 => self.varint().map(|v| Some(zigzag(v))),
            7 => self.skip(8).map(|_| None),
            8 => {
                let n = self.varint()?;
                self.skip(n).map(|_| None)
            }
            9 | 10 => {
                let head = self.byte()?;
                let size = match head >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                self.claim(size)?;
                for _ in 0..size {
                    self.value(head & 0x0f, depth + 1)?;
                }
                Ok(None)
            }
            11 => {
                let size = self.varint()?;
                if size > 0 {
                    let kinds = self.byte()?;
                    self.claim(size.saturating_mul(2))?;
                    for _ in 0..size {
                        self.value(kinds >> 4, depth + 1)?;
                        self.value(kinds & 0x0f, depth + 1)?;
                    }
                }
                Ok(None)
            }
            12 => self.structure(depth + 1, []).map(|_| None),
            13 => self.skip(16).map(|_| None),
            other => Err(format!("unknown Thrift type {other}")),
        }
    }

    /// A struct; returns the values of its integer fields `want` (0: none).
    fn structure<const N: usize>(
        &mut self,
        depth: u32,
        want: [i16; N],
    ) -> Result<[Option<i64>; N], String> {
        let mut last = 0i16;
        let mut found = [None; N];
        loop {
            let head = self.byte()?;
            if head == 0 {
                return Ok(found);
            }
            let id = match head >> 4 {
                0 => zigzag(self.varint()?) as i16,
                delta => last.wrapping_add(i16::from(delta)),
            };
            last = id;
            let v = self.value(head & 0x0f, depth)?;
            if let Some(i) = want.iter().position(|&w| w == id) {
                found[i] = v;
            }
        }
    }
}

/// Scans the Thrift struct at `buf[pos..]`: its end and its integer fields `want`.
fn scan_struct<const N: usize>(
    buf: &[u8],
    pos: usize,
    want: [i16; N],
) -> Result<(usize, [Option<i64>; N]), String> {
    let mut scan = Scan {
        buf,
        pos,
        elements: 0,
    };
    let found = scan.structure(0, want)?;
    Ok((scan.pos, found))
}

/// How much larger than its compressed bytes a page may say it is: ample for any
/// codec on real data, and it keeps a few bytes from reserving gigabytes (a 2 KB
/// input once asked for 1.9 GB this way).
fn max_uncompressed(compressed: i64) -> i64 {
    compressed.saturating_mul(1024).saturating_add(64 << 20)
}

/// Scans the footer of the Parquet file `bytes` (its `FileMetaData`).
pub fn check_footer(bytes: &[u8]) -> Result<(), String> {
    let n = bytes.len();
    if n < 12 || &bytes[n - 4..] != b"PAR1" {
        return Ok(()); // not Parquet: the parquet crate says so itself
    }
    let len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().expect("4 bytes")) as usize;
    let Some(start) = (n - 8).checked_sub(len) else {
        return Ok(()); // a footer longer than the file: the parquet crate refuses it
    };
    scan_struct(&bytes[..n - 8], start, [])
        .map(|_| ())
        .map_err(|e| format!("footer: {e}"))
}

/// Scans the page headers of one column chunk: `start` is its first page (the
/// dictionary page, if any), `len` its compressed size.
pub fn check_pages(bytes: &[u8], start: u64, len: u64) -> Result<(), String> {
    let end = start.saturating_add(len).min(bytes.len() as u64) as usize;
    let mut pos = start as usize;
    while pos < end {
        // PageHeader fields 2 and 3: uncompressed and compressed page size.
        let (header_end, [uncompressed, size]) = scan_struct(&bytes[..end], pos, [2, 3])
            .map_err(|e| format!("page header at byte {pos}: {e}"))?;
        let size = size
            .filter(|s| *s >= 0)
            .ok_or_else(|| format!("page header at byte {pos}: no valid compressed_page_size"))?;
        if let Some(u) = uncompressed.filter(|&u| u > max_uncompressed(size)) {
            return Err(format!(
                "page header at byte {pos}: {u} bytes uncompressed from {size} compressed"
            ));
        }
        pos = header_end.saturating_add(size as usize);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_of_two_billion_booleans_is_refused_at_once() {
        // struct { 1: list<bool> of 2^31 - 1 elements }, then stop.
        let mut header = vec![0x19, 0xf1, 0xff, 0xff, 0xff, 0xff, 0x07, 0x00];
        let e = scan_struct(&header, 0, []).unwrap_err();
        assert!(e.contains("list elements"), "{e}");
        // A short list of booleans is fine.
        header = vec![0x19, 0x31, 0x00];
        assert_eq!(scan_struct(&header, 0, []).unwrap().0, 3);
    }

    #[test]
    fn the_wanted_integer_field_is_read() {
        // struct { 1: i32 = 4 (zigzag 8), 3: i32 = 100 (zigzag 200), } stop
        let header = [0x15, 0x08, 0x25, 0xc8, 0x01, 0x00];
        assert_eq!(
            scan_struct(&header, 0, [3, 1]).unwrap(),
            (6, [Some(100), Some(4)])
        );
        assert!(max_uncompressed(100) < 100 << 20);
    }
}
