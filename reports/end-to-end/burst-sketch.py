# Scratch sketch (prefill-ttft.md Q4): TensorRT-LLM v0.14 QPS=INF rows as one burst of 500; not part of dse.
import numpy as np, pandas as pd
from dse.calibration.cases import fittable, load
from dse.scoring.predict import predict_frame
pd.set_option('display.width',250)
cases, truth = load(None)
inf = ~fittable(cases)
c0 = cases[inf].copy()
N = 500
def pred(phase, conc, extra=None):
    c = c0.copy(); c['phase'] = phase; c['concurrency'] = conc
    if extra:
        for k,v in extra.items(): c[k]=v
    return predict_frame(c, file="x").set_index('case_id')
dec = pred('decode', N)            # decode-only step at batch N: tpot
pre = pred('prefill', 1)           # one prompt at a time: input tokens/s per chip
rows=[]
for cid, r in c0.set_index('case_id').iterrows():
    isl, osl, chips = float(r.isl), float(r.osl), float(r.num_chips)
    Rp = pre.loc[cid,'input_tokens_per_s_per_chip']*chips      # prompt tokens/s of the instance
    td = dec.loc[cid,'tpot_s']                                  # decode-only step at batch N
    budget = 8192.0
    tc = budget/Rp + td                                         # a step carrying a budget of prompt tokens and the decodes
    W = N*isl/budget*tc                                         # the wave: every prompt prefilled
    ti = (np.arange(N)+1)*isl/budget*tc                         # request i's first token
    k = np.minimum(osl-1, (W-ti)/tc)
    itl = (k*tc + (osl-1-k)*td)/max(osl-1,1)
    span = W + (osl-1)*td                                       # the last request's decodes after the wave
    thr = N*osl/span/chips
    t = truth[truth.case_id==cid].set_index('metric').value
    rows.append(dict(case=cid[-30:], isl=isl, osl=osl, itl=itl.mean(), itl_true=t.get('tpot_s'), thr=thr, thr_true=t.get('output_tokens_per_s_per_chip')))
d=pd.DataFrame(rows); print(d.round(4).to_string())
for a,b in (('itl','itl_true'),('thr','thr_true')):
    lr=np.log(d[a]/d[b]); print(a, 'error %.3f bias %.3f'%(np.exp(np.abs(lr).mean()), np.exp(lr.mean())))
