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
        let write = run("/usr/bin/time", ["-f", "%M", "/bin/sh", "-c", "exec '\(cofferBinary)' write big.bin < '\(source)'"], environment: env)
        let writeSeconds = Date().timeIntervalSince(start)
        #expect(write.status == 0, "\(write.err)")
        let readStart = Date()
        let read = run("/usr/bin/time", ["-f", "%M", "/bin/sh", "-c", "exec '\(cofferBinary)' cat big.bin > '\(tmp.path)/out.bin'"], environment: env)
        let readSeconds = Date().timeIntervalSince(readStart)
        #expect(read.status == 0, "\(read.err)")
        let writeKiB = Int(write.err.split(separator: "\n").last ?? "") ?? -1
        let readKiB = Int(read.err.split(separator: "\n").last ?? "") ?? -1
        print("1 GiB: write \(String(format: "%.1f", writeSeconds)) s, peak RSS \(writeKiB / 1024) MiB; read \(String(format: "%.1f", readSeconds)) s, peak RSS \(readKiB / 1024) MiB")
        #expect(writeKiB > 0 && writeKiB < 200 * 1024, "write peak RSS \(writeKiB) KiB")
        #expect(readKiB > 0 && readKiB < 200 * 1024, "read peak RSS \(readKiB) KiB")
        #expect(sh("cmp '\(source)' '\(tmp.path)/out.bin'").status == 0)
    }
}
