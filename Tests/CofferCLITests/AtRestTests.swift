import CofferTestSupport
import Foundation
import Testing

/// Nothing a user stores is readable from the device's disk outside the mount.
@Suite struct AtRestTests {
    @Test func noPlaintextMarkerAnywhereInTheDataDirectory() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        let marker = "MARKER-\(UInt64.random(in: 1...UInt64.max))"
        #expect(coffer(data, ["init", "frank"]).status == 0)
        #expect(coffer(data, ["mkdir", "-p", "folder-\(marker)/inner"]).status == 0)
        #expect(
            coffer(
                data, ["write", "folder-\(marker)/inner/\(marker).txt"],
                stdin: Array(("line with \(marker)\n" + String(repeating: marker, count: 1000)).utf8)
            ).status == 0)
        // Small and large, compressible content, plus a symlink whose target carries the marker.
        let src = tmp.sub("src")
        try Data(String(repeating: "\(marker) ", count: 200_000).utf8).write(
            to: URL(fileURLWithPath: src + "/big-\(marker)"))
        symlink("/target/\(marker)", src + "/link-\(marker)")
        #expect(coffer(data, ["import", src, "imported-\(marker)"]).status == 0)
        #expect(coffer(data, ["cat", "folder-\(marker)/inner/\(marker).txt"]).out.contains(marker))
        let hits = filesContaining(marker, under: data)
        #expect(hits.isEmpty, "plaintext found in \(hits)")
        // The marker scan itself works: it finds a planted copy.
        try Data("x \(marker) y".utf8).write(to: URL(fileURLWithPath: tmp.path + "/planted"))
        #expect(filesContaining(marker, under: tmp.path).contains(tmp.path + "/planted"))
        var st = stat()
        #expect(stat(data + "/account.secret", &st) == 0)
        #expect(st.st_mode & 0o777 == 0o600)
        #expect(stat(data + "/coffer.sqlite", &st) == 0 && st.st_mode & 0o077 == 0)
    }
}
