# dev/mlacpu29/summ.py LOG: medians per shape and binary of ab.sh's rows, as ratios to the
# ceilings measured in the same run: the paired read (per run, the bench's --paired) and, for
# H 16, the vdpbf16ps issue rate of dp_peak (544 vdpbf16ps per key at 16 rows: 35.65 M per call
# for R 16 x 4096), for H 128 the bench's fp32 FMA peak; CPU-time rows on 1 thread.
import re, statistics as st, sys
rows, cpu, peak = {}, {}, []
for l in open(sys.argv[1]):
    if l.startswith('PEAK'):
        peak.append(max(float(x) for x in re.findall(r'vdpbf16ps reg ([\d.]+)', l)))
    elif l.startswith('CPU'):
        f = l.split(); cpu.setdefault((f[1], f[2], f[3], f[4]), []).append(float(f[6]))
    elif l.startswith('ROW'):
        f = l.split(); key = (f[1], f[2], f[3], f[4])
        d = {'ms': float(re.search(r'time median ([\d.]+)', l).group(1)),
             'gflops': float(re.search(r'-> ([\d.]+) GFLOP/s', l).group(1)),
             'fma': float(re.search(r'FMA peak ([\d.]+)', l).group(1))}
        m = re.search(r'paired read: ([\d.]+)%', l)
        if m: d['paired'] = float(m.group(1))
        rows.setdefault(key, []).append(d)
pk = st.median(peak) if peak else float('nan')
print('vdpbf16ps issue rate, 1 core (dp_peak on CPU time, best of its 5 rounds, median over %d runs): %.2f G/s; runs %s' % (len(peak), pk, ' '.join('%.2f' % p for p in peak)))
for key, v in rows.items():
    ms = st.median(x['ms'] for x in v); gf = st.median(x['gflops'] for x in v); fma = st.median(x['fma'] for x in v)
    s = '%-5s %-4s %-3s %-5s wall med %7.3f ms (%s) | %6.1f GFLOP/s = %4.0f%% of FMA peak %.0f' % (
        key + (ms, ' '.join('%.2f' % x['ms'] for x in v), gf, 100 * gf / fma, fma))
    if 'paired' in v[0]:
        s += ' | paired read %4.1f%% (%s)' % (st.median(x['paired'] for x in v), ' '.join('%.1f' % x['paired'] for x in v))
    c = cpu.get(key)
    if c:
        cm = st.median(c)
        s += ' | cpu/call %.2f ms (%s)' % (cm, ' '.join('%.2f' % x for x in c))
        if key[0] == 'H16':  # 35.65 M vdpbf16ps per call (R 16 x 4096 x 544)
            s += ': vdpbf16ps at %.0f%% of 1 core\'s rate' % (100 * 35.65 / cm / pk)
        else:  # the bench's FLOP count of H 128 R 4 x 4096 against the FMA peak
            s += ': %.0f GFLOP/s = %.0f%% of FMA peak' % (gf * ms / cm, 100 * gf * ms / cm / fma)
    print(s)
