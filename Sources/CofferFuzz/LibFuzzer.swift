import Foundation

// libFuzzer's hooks. Built with `-sanitize=fuzzer -DCOFFER_FUZZING` (scripts/fuzz), `main` hands
// over to libFuzzer's driver, which calls these; `COFFER_FUZZ_TARGET` picks the decoder, since
// one binary serves every target (one link instead of nine).

nonisolated(unsafe) private var selected: FuzzTarget?

@_cdecl("LLVMFuzzerInitialize")
public func fuzzInitialize(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>
) -> CInt {
    let name = ProcessInfo.processInfo.environment["COFFER_FUZZ_TARGET"] ?? ""
    guard let target = FuzzTarget(rawValue: name) else {
        let names = FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")
        FileHandle.standardError.write(Data("coffer-fuzz: set COFFER_FUZZ_TARGET to one of: \(names)\n".utf8))
        exit(2)
    }
    selected = target
    return 0
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    selected?.run(Array(UnsafeBufferPointer(start: data, count: size)))
    return 0
}

#if COFFER_FUZZING
    // libFuzzer's own `main` cannot be the entry point: SwiftPM links every executable with `main`
    // defined as the module's Swift entry point (`CofferFuzz_main`), so this one calls its driver.
    @_silgen_name("LLVMFuzzerRunDriver")
    private func runDriver(
        _ argc: UnsafeMutablePointer<CInt>,
        _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
        _ callback: @convention(c) (UnsafePointer<UInt8>, Int) -> CInt
    ) -> CInt

    @main
    struct FuzzDriver {
        static func main() {
            var argc = CommandLine.argc
            var argv = CommandLine.unsafeArgv
            exit(runDriver(&argc, &argv, { data, size in fuzz(data, size) }))
        }
    }
#endif
