//! Numbers as the trace's tables write them: thousands separated, bytes in MiB. Shared by
//! the snapshot summary and the replay's report (neither imports the other).

const MIB: f64 = 1024.0 * 1024.0;

/// `1234567` -> `"1,234,567"`.
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in MiB with one decimal and thousands separators: "3,940.0 MiB".
pub fn mib(bytes: u64) -> String {
    let tenths = (bytes as f64 / MIB * 10.0).round() as u64;
    format!("{}.{} MiB", thousands(tenths / 10), tenths % 10)
}
