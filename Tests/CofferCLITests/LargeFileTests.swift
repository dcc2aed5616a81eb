import CofferTestSupport
import Foundation
import Testing

/// A 1 GiB document goes in and out of the store with bounded memory.
@Suite struct LargeFileTests {
    @Test func oneGibibyteWriteAndReadKeepMemoryBounded() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        #expect(coffer(data, ["init", "hank"]).status == 0)
        let source = tmp.path + "/source.bin"
        #expect(sh("head -c 1073741824 /dev/urandom > '\(source)'").status == 0)
        let env = ["COFFER_DATA_DIR": data]
        let start = Date()
        // GNU time forks and execs coffer and reports that child's own peak RSS. (rusage from our
        // own posix_spawn would not do: a vfork-style child is charged the parent's memory until exec.)
        let write = run(
            "/usr/bin/time", ["-f", "%M", "/bin/sh", "-c", "exec '\(cofferBinary)' write big.bin < '\(source)'"],
            environment: env)
        let writeSeconds = Date().timeIntervalSince(start)
        #expect(write.status == 0, "\(write.err)")
        let readStart = Date()
        let read = run(
            "/usr/bin/time",
            ["-f", "%M", "/bin/sh", "-c", "exec '\(cofferBinary)' cat big.bin > '\(tmp.path)/out.bin'"],
            environment: env)
        let readSeconds = Date().timeIntervalSince(readStart)
        #expect(read.status == 0, "\(read.err)")
        let writeKiB = Int(write.err.split(separator: "\n").last ?? "") ?? -1
        let readKiB = Int(read.err.split(separator: "\n").last ?? "") ?? -1
        print(
            "1 GiB: write \(String(format: "%.1f", writeSeconds)) s, peak RSS \(writeKiB / 1024) MiB;"
                + " read \(String(format: "%.1f", readSeconds)) s, peak RSS \(readKiB / 1024) MiB"
        )
        #expect(writeKiB > 0 && writeKiB < 200 * 1024, "write peak RSS \(writeKiB) KiB")
        #expect(readKiB > 0 && readKiB < 200 * 1024, "read peak RSS \(readKiB) KiB")
        #expect(sh("cmp '\(source)' '\(tmp.path)/out.bin'").status == 0)
    }

    /// A large file rewritten in part leaves old packs mostly dead; `coffer gc` rewrites them
    /// down to their live chunks, and the file reads back byte for byte.
    @Test func gcShrinksPacksAPartialRewriteLeftMostlyDead() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        #expect(coffer(data, ["init", "ivy"]).status == 0)
        let first = pseudoRandomBytes(count: 32 << 20, seed: 1)
        #expect(coffer(data, ["write", "big.bin"], stdin: first).status == 0)
        // The same file with its first 28 MiB replaced: the last 4 MiB are the same chunks.
        let second = pseudoRandomBytes(count: 28 << 20, seed: 2) + first[(28 << 20)...]
        #expect(coffer(data, ["write", "big.bin"], stdin: second).status == 0)
        func packBytes() -> Int {
            let dir = data + "/chunks/packs"
            return ((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []).reduce(0) { sum, name in
                sum + ((try? FileManager.default.attributesOfItem(atPath: dir + "/" + name)[.size] as? Int) ?? 0)
            }
        }
        let before = packBytes()
        #expect(before > 59 << 20, "both versions are in packs: \(before) bytes")
        let gc = coffer(data, ["gc"])
        #expect(gc.status == 0, "\(gc.err)")
        #expect(
            gc.out.contains("rewrote 1 mostly unused pack\n")
                || gc.out.range(of: "rewrote [2-9][0-9]* mostly unused packs", options: .regularExpression) != nil,
            "\(gc.out)")
        // Without the rewrite the pack holding the old last 16 MiB would stay whole (44 MiB).
        let after = packBytes()
        #expect(after < 33 << 20, "only the live 32 MiB (and seals) are left: \(after) bytes")
        let same = coffer(data, ["cat", "big.bin"]).stdout == second
        #expect(same, "the file after the rewrite")
        #expect(coffer(data, ["fsck"]).status == 0)
    }
}
