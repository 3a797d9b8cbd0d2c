// Command pulumi-language-python is the Python language host that gpufleet builds for the
// Pulumi engine.
//
// Upstream's language host lives in its own Go module
// (github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3), which the Go module
// proxy reachable from the project's machines does not serve. This is a small
// implementation of the same gRPC contract (pulumirpc.LanguageRuntimeServer) built on the
// pieces that *are* in the served github.com/pulumi/pulumi/sdk/v3 module:
//
//   - python/toolchain resolves the interpreter / virtualenv (pip, uv or poetry) from the
//     `runtime.options` of Pulumi.yaml or PulumiPolicy.yaml;
//   - python/cmd/pulumi-language-python-exec is the Python shim that runs a program; the
//     build script installs it next to this binary.
//
// Supported: Run (preview/up/destroy/refresh), GetRequiredPackages/GetRequiredPlugins,
// RunPlugin (Python policy packs via `python -m pulumi.policy`, and Python plugins),
// InstallDependencies, GetProgramDependencies, About, Cancel.
// Not supported (Unimplemented): code generation (GenerateProgram/Project/Package, Pack,
// Link, Template), i.e. `pulumi convert`, `pulumi package gen-sdk` for Python.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource/plugin"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/cmdutil"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/logging"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	"github.com/pulumi/pulumi/sdk/v3/go/common/version"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"github.com/pulumi/pulumi/sdk/v3/python/toolchain"
)

const (
	execScriptName = "pulumi-language-python-exec"
	// Exit code of the exec shim after it has already reported a user-actionable error.
	exitCodeBail = 32
)

func main() {
	fs := flag.NewFlagSet(os.Args[0], flag.ContinueOnError)
	tracing := fs.String("tracing", "", "Emit tracing to a Zipkin-compatible tracing endpoint")
	logToStderr := fs.Bool("logtostderr", false, "Log to stderr")
	logFlow := fs.Bool("logflow", false, "Flow logging settings to child processes")
	verbose := fs.Int("v", 0, "Logging verbosity")
	// Flags older engines passed; accepted and, where meaningful, used as defaults.
	root := fs.String("root", "", "Project root (legacy)")
	virtualenv := fs.String("virtualenv", "", "Virtual environment path (legacy)")
	_ = fs.String("toolchain", "", "Toolchain (legacy)")
	_ = fs.String("typechecker", "", "Type checker (legacy)")
	executor := fs.String("use-executor", "", "Path to the pulumi-language-python-exec shim")
	showVersion := fs.Bool("version", false, "Print the version and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *showVersion {
		fmt.Println(version.Version)
		return
	}
	logging.InitLogging(*logToStderr, *verbose, *logFlow)
	cmdutil.InitTracing("pulumi-language-python", "pulumi-language-python", *tracing)

	var engineAddress string
	if args := fs.Args(); len(args) > 0 {
		engineAddress = args[len(args)-1]
	}

	execScript := *executor
	if execScript == "" {
		self, err := os.Executable()
		if err == nil {
			if resolved, rerr := filepath.EvalSymlinks(self); rerr == nil {
				self = resolved
			}
			execScript = filepath.Join(filepath.Dir(self), execScriptName)
		}
	}
	if _, err := os.Stat(execScript); err != nil {
		cmdutil.Exit(fmt.Errorf("missing executor %s: %w", execScript, err))
	}

	ctx, cancel := context.WithCancel(context.Background())
	host := &languageHost{
		engineAddress: engineAddress,
		tracing:       *tracing,
		execScript:    execScript,
		legacyRoot:    *root,
		legacyVenv:    *virtualenv,
		ctx:           ctx,
		cancel:        cancel,
	}
	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, host)
			return nil
		},
		Options: rpcutil.TracingServerInterceptorOptions(nil),
	})
	if err != nil {
		cmdutil.Exit(fmt.Errorf("could not start language host RPC server: %w", err))
	}
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		cmdutil.Exit(fmt.Errorf("language host RPC stopped serving: %w", err))
	}
}

type languageHost struct {
	pulumirpc.UnimplementedLanguageRuntimeServer

	engineAddress string
	tracing       string
	execScript    string
	legacyRoot    string
	legacyVenv    string

	// ctx is cancelled by the Cancel RPC; child processes are started under it.
	ctx    context.Context
	cancel context.CancelFunc
}

// pythonOptions turns ProgramInfo (root, program dir, runtime.options) into toolchain options.
func (h *languageHost) pythonOptions(info *pulumirpc.ProgramInfo) (toolchain.PythonOptions, error) {
	opts := toolchain.PythonOptions{
		Root:       h.legacyRoot,
		ProgramDir: h.legacyRoot,
		Virtualenv: h.legacyVenv,
		Toolchain:  toolchain.Auto,
	}
	if info == nil {
		return opts, nil
	}
	if info.RootDirectory != "" {
		opts.Root = info.RootDirectory
	}
	if info.ProgramDirectory != "" {
		opts.ProgramDir = info.ProgramDirectory
	}
	if info.Options == nil {
		return opts, nil
	}
	o := info.Options.AsMap()
	if v, ok := o["virtualenv"]; ok {
		s, ok := v.(string)
		if !ok {
			return opts, errors.New("virtualenv option must be a string")
		}
		opts.Virtualenv = s
	}
	if v, ok := o["toolchain"]; ok {
		switch v {
		case "pip":
			opts.Toolchain = toolchain.Pip
		case "poetry":
			opts.Toolchain = toolchain.Poetry
		case "uv":
			opts.Toolchain = toolchain.Uv
		default:
			return opts, fmt.Errorf("unsupported toolchain option %v (want pip, poetry or uv)", v)
		}
	}
	if v, ok := o["typechecker"]; ok {
		switch v {
		case "mypy":
			opts.Typechecker = toolchain.TypeCheckerMypy
		case "pyright":
			opts.Typechecker = toolchain.TypeCheckerPyright
		default:
			return opts, fmt.Errorf("unsupported typechecker option %v (want mypy or pyright)", v)
		}
	}
	return opts, nil
}

// resolve returns the toolchain for a program and checks its virtualenv (if any) is usable.
func (h *languageHost) resolve(ctx context.Context, info *pulumirpc.ProgramInfo) (
	toolchain.Toolchain, toolchain.PythonOptions, error,
) {
	opts, err := h.pythonOptions(info)
	if err != nil {
		return nil, opts, err
	}
	tc, err := toolchain.ResolveToolchain(opts)
	if err != nil {
		return nil, opts, err
	}
	if opts.Virtualenv != "" || opts.Toolchain == toolchain.Uv || opts.Toolchain == toolchain.Poetry {
		if err := tc.ValidateVenv(ctx); err != nil {
			return nil, opts, err
		}
	}
	return tc, opts, nil
}

func (h *languageHost) Handshake(
	ctx context.Context, req *pulumirpc.LanguageHandshakeRequest,
) (*pulumirpc.LanguageHandshakeResponse, error) {
	if req.EngineAddress != "" {
		h.engineAddress = req.EngineAddress
	}
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

func (h *languageHost) GetPluginInfo(context.Context, *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version.Version}, nil
}

func (h *languageHost) Cancel(context.Context, *emptypb.Empty) (*emptypb.Empty, error) {
	h.cancel()
	return &emptypb.Empty{}, nil
}

func (h *languageHost) RuntimeOptionsPrompts(
	context.Context, *pulumirpc.RuntimeOptionsRequest,
) (*pulumirpc.RuntimeOptionsResponse, error) {
	return &pulumirpc.RuntimeOptionsResponse{}, nil
}

// listPluginsScript prints, as JSON, every installed distribution that ships a top-level
// pulumi-plugin.json (the convention Pulumi Python SDKs use to name their provider plugin).
const listPluginsScript = `
import json, sys
import importlib.metadata as md
out, seen = [], set()
for d in md.distributions():
    name = d.metadata.get("Name") or ""
    key = name.lower().replace("_", "-")
    if not name or key in seen:
        continue
    seen.add(key)
    for f in d.files or []:
        if f.name == "pulumi-plugin.json" and len(f.parts) == 2:
            try:
                out.append({"package": name, "version": d.version, "plugin": json.loads(f.read_text())})
            except Exception as e:
                print("warning: %s: %s" % (f, e), file=sys.stderr)
json.dump(out, sys.stdout)
`

type installedPlugin struct {
	Package string                  `json:"package"`
	Version string                  `json:"version"`
	Plugin  plugin.PulumiPluginJSON `json:"plugin"`
}

func (h *languageHost) requiredPackages(
	ctx context.Context, info *pulumirpc.ProgramInfo,
) ([]*pulumirpc.PackageDependency, error) {
	tc, _, err := h.resolve(ctx, info)
	if err != nil {
		return nil, err
	}
	cmd, err := tc.Command(ctx, "-c", listPluginsScript)
	if err != nil {
		return nil, err
	}
	if info != nil && info.ProgramDirectory != "" {
		cmd.Dir = info.ProgramDirectory
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("listing Pulumi packages with %s: %w: %s", cmd.Path, err, stderr.String())
	}
	var found []installedPlugin
	if err := json.Unmarshal(out, &found); err != nil {
		return nil, fmt.Errorf("parsing package list: %w", err)
	}
	var deps []*pulumirpc.PackageDependency
	for _, p := range found {
		if !p.Plugin.Resource {
			continue
		}
		name := p.Plugin.Name
		if name == "" {
			name = strings.TrimPrefix(strings.ToLower(p.Package), "pulumi-")
		}
		ver := p.Plugin.Version
		if ver == "" {
			ver = p.Version
		}
		if ver != "" && !strings.HasPrefix(ver, "v") {
			ver = "v" + ver
		}
		dep := &pulumirpc.PackageDependency{
			Name:    name,
			Kind:    "resource",
			Version: ver,
			Server:  p.Plugin.Server,
		}
		if pz := p.Plugin.Parameterization; pz != nil {
			dep.Parameterization = &pulumirpc.PackageParameterization{
				Name: pz.Name, Version: pz.Version, Value: pz.Value,
			}
		}
		if pz := p.Plugin.ExtensionParameterization; pz != nil {
			dep.Extension = &pulumirpc.PackageParameterization{
				Name: pz.Name, Version: pz.Version, Value: pz.Value,
			}
		}
		logging.V(5).Infof("required package: %s %s (from %s)", dep.Name, dep.Version, p.Package)
		deps = append(deps, dep)
	}
	return deps, nil
}

func (h *languageHost) GetRequiredPackages(
	ctx context.Context, req *pulumirpc.GetRequiredPackagesRequest,
) (*pulumirpc.GetRequiredPackagesResponse, error) {
	deps, err := h.requiredPackages(ctx, req.Info)
	if err != nil {
		return nil, err
	}
	return &pulumirpc.GetRequiredPackagesResponse{Packages: deps}, nil
}

func (h *languageHost) GetRequiredPlugins(
	ctx context.Context, req *pulumirpc.GetRequiredPluginsRequest,
) (*pulumirpc.GetRequiredPluginsResponse, error) {
	deps, err := h.requiredPackages(ctx, req.Info)
	if err != nil {
		return nil, err
	}
	var plugins []*pulumirpc.PluginDependency
	for _, d := range deps {
		if d.Parameterization != nil {
			continue
		}
		plugins = append(plugins, &pulumirpc.PluginDependency{
			Name: d.Name, Kind: d.Kind, Version: d.Version, Server: d.Server,
		})
	}
	return &pulumirpc.GetRequiredPluginsResponse{Plugins: plugins}, nil
}

// typecheck runs mypy or pyright over the program directory when runtime.options asks for it.
func typecheck(ctx context.Context, tc toolchain.Toolchain, opts toolchain.PythonOptions, dir string) error {
	var module string
	switch opts.Typechecker {
	case toolchain.TypeCheckerMypy:
		module = "mypy"
	case toolchain.TypeCheckerPyright:
		module = "pyright"
	default:
		return nil
	}
	cmd, err := tc.ModuleCommand(ctx, module, ".")
	if err != nil {
		return err
	}
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s type checking failed: %w", module, err)
	}
	return nil
}

func (h *languageHost) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	ctx, stop := mergeCancel(ctx, h.ctx)
	defer stop()

	tc, opts, err := h.resolve(ctx, req.Info)
	if err != nil {
		return &pulumirpc.RunResponse{Error: err.Error()}, nil
	}

	pwd := req.Pwd
	programDir := pwd
	entry := req.Program //nolint:staticcheck // fallback for engines without ProgramInfo
	if req.Info != nil {
		if req.Info.ProgramDirectory != "" {
			programDir = req.Info.ProgramDirectory
		}
		if req.Info.EntryPoint != "" {
			entry = req.Info.EntryPoint
		}
	}
	if entry == "" {
		entry = "."
	}
	program := entry
	if !filepath.IsAbs(program) {
		program = filepath.Join(programDir, program)
	}
	if pwd == "" {
		pwd = programDir
	}

	if err := typecheck(ctx, tc, opts, programDir); err != nil {
		return &pulumirpc.RunResponse{Error: err.Error()}, nil
	}

	args := []string{"-u", h.execScript}
	add := func(k, v string) {
		if v != "" {
			args = append(args, "--"+k, v)
		}
	}
	add("monitor", req.MonitorAddress)
	add("engine", h.engineAddress)
	add("project", req.Project)
	add("stack", req.Stack)
	add("pwd", pwd)
	add("dry_run", strconv.FormatBool(req.DryRun))
	add("parallel", strconv.Itoa(int(req.Parallel)))
	add("tracing", h.tracing)
	add("organization", req.Organization)
	if req.Info != nil {
		add("root_directory", req.Info.RootDirectory)
	}
	args = append(args, program)
	args = append(args, req.Args...)

	cmd, err := tc.Command(ctx, args...)
	if err != nil {
		return &pulumirpc.RunResponse{Error: err.Error()}, nil
	}
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	if len(req.Config) > 0 {
		b, err := json.Marshal(req.Config)
		if err != nil {
			return nil, fmt.Errorf("serializing config: %w", err)
		}
		env = append(env, "PULUMI_CONFIG="+string(b))
	}
	if len(req.ConfigSecretKeys) > 0 {
		b, err := json.Marshal(req.ConfigSecretKeys)
		if err != nil {
			return nil, fmt.Errorf("serializing config secret keys: %w", err)
		}
		env = append(env, "PULUMI_CONFIG_SECRET_KEYS="+string(b))
	}
	cmd.Env = env
	cmd.Dir = pwd
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	logging.V(5).Infof("language host launching: %s %s", cmd.Path, strings.Join(args, " "))

	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			if exitErr.ExitCode() == exitCodeBail {
				return &pulumirpc.RunResponse{Bail: true}, nil
			}
			return &pulumirpc.RunResponse{
				Error: fmt.Sprintf("Program exited with non-zero exit code: %d", exitErr.ExitCode()),
			}, nil
		}
		return &pulumirpc.RunResponse{
			Error: fmt.Sprintf("Problem executing program (could not run language executor): %v", err),
		}, nil
	}
	return &pulumirpc.RunResponse{}, nil
}

// streamWriter forwards a child's output over a server stream, one message per write.
type streamWriter struct {
	mu   *sync.Mutex
	send func([]byte) error
}

func (w streamWriter) Write(p []byte) (int, error) {
	buf := append([]byte(nil), p...)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.send(buf); err != nil {
		return 0, err
	}
	return len(p), nil
}

// RunPlugin runs a plugin written in Python. The engine uses it for Python policy packs
// (kind "analyzer", PulumiPolicy.yaml with runtime python), which are started through
// the SDK's `pulumi.policy` runner, and for Python resource plugins (PulumiPlugin.yaml).
func (h *languageHost) RunPlugin(
	req *pulumirpc.RunPluginRequest, server grpc.ServerStreamingServer[pulumirpc.RunPluginResponse],
) error {
	ctx, stop := mergeCancel(server.Context(), h.ctx)
	defer stop()

	tc, opts, err := h.resolve(ctx, req.Info)
	if err != nil {
		return err
	}
	programDir := opts.ProgramDir
	if programDir == "" {
		programDir = req.Pwd
	}

	var args []string
	if req.Kind == "analyzer" {
		args = append([]string{"-u", "-m", "pulumi.policy"}, req.Args...)
		args = append(args, programDir)
	} else {
		args = append([]string{"-u", programDir}, req.Args...)
	}
	cmd, err := tc.Command(ctx, args...)
	if err != nil {
		return err
	}
	env := req.Env
	if len(env) == 0 {
		env = os.Environ()
	}
	if venv, verr := tc.VirtualEnvPath(ctx); verr == nil && venv != "" {
		env = toolchain.ActivateVirtualEnv(env, venv)
	}
	cmd.Env = env
	cmd.Dir = req.Pwd

	var mu sync.Mutex
	cmd.Stdout = streamWriter{mu: &mu, send: func(b []byte) error {
		return server.Send(&pulumirpc.RunPluginResponse{Output: &pulumirpc.RunPluginResponse_Stdout{Stdout: b}})
	}}
	cmd.Stderr = streamWriter{mu: &mu, send: func(b []byte) error {
		return server.Send(&pulumirpc.RunPluginResponse{Output: &pulumirpc.RunPluginResponse_Stderr{Stderr: b}})
	}}
	logging.V(5).Infof("language host launching plugin: %s %s", cmd.Path, strings.Join(args, " "))

	code := int32(0)
	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) {
			return fmt.Errorf("running plugin %s: %w", programDir, err)
		}
		code = int32(exitErr.ExitCode())
	}
	mu.Lock()
	defer mu.Unlock()
	return server.Send(&pulumirpc.RunPluginResponse{Output: &pulumirpc.RunPluginResponse_Exitcode{Exitcode: code}})
}

func (h *languageHost) InstallDependencies(
	req *pulumirpc.InstallDependenciesRequest, server grpc.ServerStreamingServer[pulumirpc.InstallDependenciesResponse],
) error {
	ctx := server.Context()
	opts, err := h.pythonOptions(req.Info)
	if err != nil {
		return err
	}
	tc, err := toolchain.ResolveToolchain(opts)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	stdout := streamWriter{mu: &mu, send: func(b []byte) error {
		return server.Send(&pulumirpc.InstallDependenciesResponse{Stdout: b})
	}}
	stderr := streamWriter{mu: &mu, send: func(b []byte) error {
		return server.Send(&pulumirpc.InstallDependenciesResponse{Stderr: b})
	}}
	dir := opts.ProgramDir
	if dir == "" {
		dir = req.Directory //nolint:staticcheck // fallback for engines without ProgramInfo
	}
	if err := tc.InstallDependencies(ctx, dir, req.UseLanguageVersionTools, true, stdout, stderr); err != nil {
		return err
	}
	if req.IsPlugin {
		return tc.InstallPackage(ctx, dir, req.UseLanguageVersionTools, true, stdout, stderr)
	}
	return nil
}

func (h *languageHost) GetProgramDependencies(
	ctx context.Context, req *pulumirpc.GetProgramDependenciesRequest,
) (*pulumirpc.GetProgramDependenciesResponse, error) {
	tc, _, err := h.resolve(ctx, req.Info)
	if err != nil {
		return nil, err
	}
	pkgs, err := tc.ListPackages(ctx, req.TransitiveDependencies)
	if err != nil {
		return nil, err
	}
	deps := make([]*pulumirpc.DependencyInfo, 0, len(pkgs))
	for _, p := range pkgs {
		deps = append(deps, &pulumirpc.DependencyInfo{Name: p.Name, Version: p.Version})
	}
	return &pulumirpc.GetProgramDependenciesResponse{Dependencies: deps}, nil
}

func (h *languageHost) About(ctx context.Context, req *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	tc, _, err := h.resolve(ctx, req.Info)
	if err != nil {
		return nil, err
	}
	info, err := tc.About(ctx)
	if err != nil {
		return nil, err
	}
	return &pulumirpc.AboutResponse{
		Executable: info.PythonExecutable,
		Version:    info.PythonVersion.String(),
		Metadata:   map[string]string{"toolchain": info.ToolchainVersion.String()},
	}, nil
}

func (h *languageHost) GenerateProgram(
	context.Context, *pulumirpc.GenerateProgramRequest,
) (*pulumirpc.GenerateProgramResponse, error) {
	return nil, unsupported("GenerateProgram")
}

func (h *languageHost) GenerateProject(
	context.Context, *pulumirpc.GenerateProjectRequest,
) (*pulumirpc.GenerateProjectResponse, error) {
	return nil, unsupported("GenerateProject")
}

func (h *languageHost) GeneratePackage(
	context.Context, *pulumirpc.GeneratePackageRequest,
) (*pulumirpc.GeneratePackageResponse, error) {
	return nil, unsupported("GeneratePackage")
}

func unsupported(method string) error {
	return status.Errorf(codes.Unimplemented,
		"%s is not supported by gpufleet's pulumi-language-python (code generation is not built in)", method)
}

// mergeCancel returns a context that is done when either parent is.
func mergeCancel(a, b context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(a)
	stopAfter := context.AfterFunc(b, cancel)
	return ctx, func() { stopAfter(); cancel() }
}

var _ io.Writer = streamWriter{}
