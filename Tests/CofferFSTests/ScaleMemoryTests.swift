import CofferTestSupport
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 21: memory must not grow with the tree. One store is measured with 20,000 files, grown to
/// 100,000 and measured again: the mount daemon's resident memory right after mounting and after
/// `ls -lR` of everything (and its peak by then), and the peak of `coffer ls` of one 100-file
/// folder and of `coffer status`. Timings belong to `scripts/bench scale`, not here.
///
/// Run alone: `swift test --filter ScaleMemoryTests`.
@Suite struct ScaleMemoryTests {
    /// How much any figure may grow from 20,000 to 100,000 files: 60 MiB, about 770 bytes per
    /// added file (measured: 34 MiB for the daemon after `ls -lR`, nothing for the rest). Past
    /// what an empty tree needs, a daemon or CLI that reads the tree from SQLite as it goes needs
    /// only bounded caches, which the bigger walk can fill where the smaller one did not:
    /// SQLite's page caches (16 MiB for the writer, 2-4 MiB per read connection, see `Store`),
    /// the vault's and the inode table's caches (16,384 entries each), and, in the
    /// daemon, an entry per inode the kernel still remembers after the walk (45-56 bytes, 4 MiB
    /// for 80,000 more): about 40 MiB in all, and the allocator's slack on top. Holding the tree
    /// in memory costs kilobytes per file, 250-330 MiB here, so the bound tells the two apart
    /// with room on both sides.
    static let boundKiB = 60 * 1024
    static let smallTree = 20_000
    static let bigTree = 100_000

    struct Figures: CustomStringConvertible {
        var mounted = 0
        var walked = 0
        var walkPeak = 0
        var ls = 0
        var status = 0
        var description: String {
            "daemon RSS after mount \(mounted / 1024) MiB, after ls -lR \(walked / 1024) MiB (peak "
                + "\(walkPeak / 1024) MiB); peak RSS of coffer ls \(ls / 1024) MiB, of coffer status "
                + "\(status / 1024) MiB"
        }
    }

    @Test func daemonAndCLIMemoryDoNotGrowFrom20000To100000Files() throws {
        let start = Date()
        var timings: [String] = []
        func lap(_ what: String, since: inout Date) {
            timings.append(String(format: "%@ %.0f s", what, Date().timeIntervalSince(since)))
            since = Date()
        }
        var t = start
        // The files are empty, as what is measured is the tree (content costs no memory until it
        // is read) and 1-64 bytes each cost the debug daemon half as much again; and they are
        // written through the mount, the fastest way in (`coffer import` took 2-3 times as long).
        // The second fill extends the same tree, so the two sizes share the first 20,000 files.
        let m = try MountFixture("coffer-scale")
        try fill(m, 0..<Self.smallTree)
        lap("fill 20k", since: &t)
        var small = Figures()
        try measureCLI(m, &small)
        try m.mount()
        try measureDaemon(m, files: Self.smallTree, &small)
        lap("measure 20k", since: &t)
        try fill(m, Self.smallTree..<Self.bigTree)
        lap("fill 100k", since: &t)
        var big = Figures()
        try measureCLI(m, &big)
        try m.mount()
        try measureDaemon(m, files: Self.bigTree, &big)
        try m.unmount()
        lap("measure 100k", since: &t)
        print(
            "ScaleMemoryTests: \(Self.smallTree) files: \(small)\n\(Self.bigTree) files: \(big)\n"
                + "\(timings.joined(separator: ", ")); in all \(Int(Date().timeIntervalSince(start))) s")

        let rows: [(String, Int, Int)] = [
            ("daemon RSS right after mounting", small.mounted, big.mounted),
            ("daemon RSS after ls -lR", small.walked, big.walked),
            ("daemon peak RSS after ls -lR", small.walkPeak, big.walkPeak),
            ("peak RSS of coffer ls FOLDER", small.ls, big.ls),
            ("peak RSS of coffer status", small.status, big.status),
        ]
        for (what, a, b) in rows {
            let growth =
                "\(what) grew by \((b - a) / 1024) MiB from \(Self.smallTree) to \(Self.bigTree) files "
                + "(\(a / 1024) -> \(b / 1024) MiB; bound \(Self.boundKiB / 1024) MiB)"
            #expect(b - a < Self.boundKiB, "\(growth)")
        }
    }

    /// Writes files `indices` of the tree into the mount, then unmounts (which waits until the
    /// daemon has committed them).
    private func fill(_ m: MountFixture, _ indices: Range<Int>) throws {
        try writeSmallFileTree(at: m.path("tree"), indices: indices, maxSize: 0)
        try m.unmount()
    }

    /// The mounted daemon's memory right after mounting and after walking the whole tree.
    private func measureDaemon(_ m: MountFixture, files: Int, _ f: inout Figures) throws {
        let pid = try #require(m.daemonPID, "no daemon pid")
        // What the daemon holds once mounted, before any request but the mount's own.
        usleep(500_000)
        f.mounted = try #require(processMemoryKiB(pid, "VmRSS"))
        let walk = run("/bin/ls", ["-lR", m.mountPoint])
        try #require(walk.status == 0, "ls -lR: \(walk.err)")
        let listed = walk.out.split(separator: "\n").filter { $0.hasPrefix("-") }.count
        try #require(listed == files, "ls -lR listed \(listed) files, expected \(files)")
        f.walked = try #require(processMemoryKiB(pid, "VmRSS"))
        f.walkPeak = try #require(processMemoryKiB(pid, "VmHWM"))
    }

    /// Peak memory of `coffer ls` of one 100-file folder and of `coffer status` (store unmounted).
    private func measureCLI(_ m: MountFixture, _ f: inout Figures) throws {
        let env = ["COFFER_DATA_DIR": m.dataDir]
        let (ls, lsPeak) = try runMeasuringPeak(cofferBinary, ["ls", "/tree/t000/s000"], environment: env)
        try #require(ls.status == 0, "coffer ls: \(ls.err)")
        try #require(ls.out.split(separator: "\n").count == 100, "coffer ls listed: \(ls.out.prefix(200))")
        f.ls = lsPeak
        let (status, statusPeak) = try runMeasuringPeak(cofferBinary, ["status"], environment: env)
        try #require(status.status == 0, "coffer status: \(status.err)")
        f.status = statusPeak
    }
}
